"""Tensor parallelism over two "nodes" on one CPU machine (gloo): node 0 is an Engine (or
``specdec serve``) in one process, node 1 ``specdec serve --node-rank 1`` in another; greedy output
equals tp 1 plain and with EAGLE-3; a node that never joins, flags that differ and a node that dies
end in clear errors within seconds, never a hang."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

from specdec.engine.engine import Engine  # noqa: E402
from specdec.engine.tp_worker import TPWorkerError  # noqa: E402

from ..serve_process import wait_healthy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 3, 88, 41, 9, 60], [2, 33, 71, 14, 52, 8, 95, 11, 4]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=2,
            speculative_num_draft_tokens=5)
TIMEOUT = 30  # --dist-timeout where every node is started


@pytest.fixture(scope="module")
def checkpoint(qwen3_tp_checkpoint):
    return qwen3_tp_checkpoint


def _addr() -> str:
    """127.0.0.1:P with P and P+1 free (the store and the control channel)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return f"127.0.0.1:{port}"
    raise RuntimeError("no two free ports in a row")


def _flags(flags: dict) -> list[str]:
    return [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def _node(rank: int, path: str, addr: str, flags: dict, *, timeout: int = TIMEOUT, extra=()) -> subprocess.Popen:
    """``specdec serve`` on node ``rank`` of 2 (node 0 serves HTTP at ``extra``'s --port)."""
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--model-path", path, "--tp-size", "2", "--nnodes", "2",
           "--node-rank", str(rank), "--dist-init-addr", addr, "--dist-timeout", str(timeout),
           *_flags(flags), *extra]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _outputs(engine) -> list[list[int]]:
    return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]


@pytest.mark.parametrize("flags", [{}, SPEC], ids=["plain", "eagle3"])
def test_two_nodes_equal_tp1(checkpoint, flags):
    path, head = checkpoint
    flags = {**flags, "speculative_draft_model_path": head} if flags else {}
    expected = _outputs(Engine(path))
    addr = _addr()
    follower = _node(1, path, addr, flags)
    engine = Engine(path, tp_size=2, nnodes=2, dist_init_addr=addr, dist_timeout=TIMEOUT, **flags)
    try:
        assert engine.target_model.tp.size == 2
        out = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in out] == expected
        if flags:
            assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)
    finally:
        engine.shutdown()
    assert follower.wait(timeout=30) == 0, follower.stdout.read()


def test_a_node_that_never_joins(checkpoint):
    path, _ = checkpoint
    start = time.monotonic()
    with pytest.raises(TPWorkerError, match=r"node\(s\) 1 did not join within 2 s \(--dist-timeout\)"):
        Engine(path, tp_size=2, nnodes=2, dist_init_addr=_addr(), dist_timeout=2)
    assert time.monotonic() - start < 15


def test_node_0_that_never_comes_and_flags_that_differ(checkpoint):
    path, _ = checkpoint
    lonely = _node(1, path, _addr(), {}, timeout=2)
    addr = _addr()
    other = _node(1, path, addr, {"max_running_requests": 8})
    with pytest.raises(TPWorkerError, match=r"node 1's flags differ from node 0's: --max-running-requests 8"):
        Engine(path, tp_size=2, nnodes=2, dist_init_addr=addr, dist_timeout=TIMEOUT)
    assert other.wait(timeout=30) == 1 and "refused it" in other.stdout.read()
    assert lonely.wait(timeout=30) == 1 and "node 0 did not answer at" in lonely.stdout.read()


def test_server_stops_with_the_cause_when_a_node_dies(checkpoint):
    path, _ = checkpoint
    expected = _outputs(Engine(path))
    addr, port = _addr(), int(_addr().rpartition(":")[2])
    server = _node(0, path, addr, {}, extra=["--port", str(port), "--log-level", "warning"])
    follower = _node(1, path, addr, {})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url)
        r = httpx.post(f"{url}/generate", json={"input_ids": PROMPTS, "sampling_params": GREEDY}, timeout=60)
        assert [o["output_ids"] for o in r.json()] == expected
        follower.send_signal(signal.SIGKILL)  # the whole node 1 (it runs one rank, in-process)
        assert server.wait(timeout=30) == 1
        assert "tensor-parallel rank 1 (node 1) is gone" in server.stdout.read()
    finally:
        for proc in (server, follower):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
