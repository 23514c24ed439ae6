"""On the GPU: CUDA-graph replay equals eager execution token for token, for every captured batch
size and for padded ones; a decode step makes no host sync but its one read of the results.

fp32 keeps the comparison exact: the graph plans attention for a static length bound, so its
split-KV partition differs from the eager plan's, which in bf16 may round a near-tie differently
(bf16 losslessness with graphs is tests/e2e/test_gpu_lossless.py, where graphs are on).
"""

import pytest
import torch

from .helpers import assert_no_leak, engine, make_pair, prompts_of

pytestmark = pytest.mark.gpu

SIZES = [1, 2, 4, 8]


def _generate_each_batch_size(eng, vocab):
    """One batch of every size 1..8 (3, 5, 6, 7 replay padded graphs)."""
    outputs = []
    for bs in range(1, 9):
        prompts = prompts_of([3 + 5 * i for i in range(bs)], vocab, seed=bs)
        params = [{"temperature": 0, "max_new_tokens": 12 + 3 * i, "ignore_eos": True} for i in range(bs)]
        outputs.append([g["output_ids"] for g in eng.generate(input_ids=prompts, sampling_params=params)])
    return outputs


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", [None, (3, 1, 4), (5, 4, 8), (6, 8, 32)], ids=lambda s: "plain" if s is None else "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_graph_replay_equals_eager(algorithm, shape, page_size):
    if shape is None and algorithm == "EAGLE3":
        pytest.skip("plain decoding has no draft head")
    target, draft = make_pair(algorithm, "mixed")
    target, draft = target.cuda(), draft.cuda()
    kw = dict(device="cuda", attention_backend="triton", page_size=page_size, disable_cuda_graph=True)
    if shape is not None:
        kw.update(draft=draft, algorithm=algorithm, shape=shape)
    eager = engine(target, **kw)
    graphs = engine(target, **kw)
    graphs.capture_cuda_graphs(SIZES)
    assert all(g.use_graphs for g in graphs.runner.graphs.values())
    assert _generate_each_batch_size(graphs, target.config.vocab_size) == _generate_each_batch_size(
        eager, target.config.vocab_size)
    assert_no_leak(graphs)


@pytest.mark.parametrize("overlap", [True, False])
def test_decode_step_reads_the_device_once(overlap):
    """torch's sync debug mode raises on any synchronizing call while a decode step is launched
    (without overlap, the allocator's work at the start of the step, while the device is idle,
    is let through; with overlap the host reserves slots before the launch)."""
    target, draft = make_pair("EAGLE3", "mixed")
    eng = engine(target.cuda(), draft.cuda(), algorithm="EAGLE3", shape=(5, 4, 8), device="cuda",
                 attention_backend="triton", cuda_graph_max_bs=4, overlap_schedule=overlap)
    alloc = eng.memory.alloc_extend

    def alloc_outside_debug(*args):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return alloc(*args)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    if not overlap:
        eng.memory.alloc_extend = alloc_outside_debug
    launch = eng.worker.launch_decode
    launches = []

    def checked_launch(*args, **kw):
        launches.append(kw.get("slots_reserved"))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(*args, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    eng.worker.launch_decode = checked_launch
    prompts = prompts_of([4, 7, 2], target.config.vocab_size)
    out = eng.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 20, "ignore_eos": True})
    assert all(len(o["output_ids"]) == 20 for o in out)
    assert launches and set(launches) == {overlap}
    assert_no_leak(eng)
