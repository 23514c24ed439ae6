"""SGLang's /start_profile and /stop_profile: the engine's steps profiled into files where the engine
runs, every field honored or refused with a 400 naming it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from specdec.server.profiler import PROFILER_DIR_ENV, ProfileConflict, ProfileOptions, StepProfiler

from ..e2e.helpers import engine, make_pair
from .live import LiveServer, kv_is_free

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}


def test_profiler_begins_at_its_start_step_and_ends_after_num_steps(tmp_path):
    prof = StepProfiler(cuda=lambda: False)
    message = prof.start(ProfileOptions(output_dir=str(tmp_path), start_step=2, num_steps=3, activities=["HOST"],
                                        profile_prefix="unit"))
    assert message.startswith("Start profiling (HOST) at step +2 for 3 steps:")
    for step in range(5):
        assert prof.active and list(tmp_path.iterdir()) == []  # waiting 2 steps, then profiling 3
        prof.after_step()
    assert not prof.active
    (written,) = tmp_path.iterdir()
    assert written.name.startswith("unit-") and written.name.endswith("-TP-0.host.txt")
    assert "==== by tottime" in written.read_text() and "==== by cumulative" in written.read_text()
    with pytest.raises(ProfileConflict, match="no profile is running"):
        prof.stop()


def test_a_profile_that_cannot_be_written_leaves_the_profiler_idle(tmp_path):
    prof = StepProfiler(cuda=lambda: False)
    prof.start(ProfileOptions(output_dir=str(tmp_path), num_steps=1, activities=["HOST"]))
    tmp_path.rmdir()  # where it was to write is gone
    prof.after_step()  # logged, not raised: the engine's step goes on
    assert not prof.active
    tmp_path.mkdir()
    prof.start(ProfileOptions(output_dir=str(tmp_path), activities=["HOST"]))
    assert len(prof.stop()) == 1


def test_profiler_refuses_what_it_cannot_honor(tmp_path):
    prof = StepProfiler(cuda=lambda: False)
    for options, field in ((ProfileOptions(activities=["GPU"]), "activities: GPU needs an engine on CUDA"),
                           (ProfileOptions(activities=["MEM"]), "activities: MEM needs an engine on CUDA"),
                           (ProfileOptions(activities=["RPD"]), "activities: 'RPD'"),
                           (ProfileOptions(activities=[]), "activities: empty"),
                           (ProfileOptions(num_steps=0), "num_steps: 0"),
                           (ProfileOptions(output_dir=str(tmp_path / "file") + "/sub"), "output_dir:")):
        (tmp_path / "file").write_text("a file, not a folder")
        with pytest.raises(ValueError, match=field.replace("(", r"\(")):
            prof.start(options)
        assert not prof.active


def test_start_and_stop_profile_through_the_server(tmp_path, monkeypatch):
    """A profile of two steps writes its files by itself; one stopped by /stop_profile writes what it
    has; the requests served meanwhile are whole; bad fields are 400s naming them."""
    monkeypatch.setenv(PROFILER_DIR_ENV, str(tmp_path / "default"))  # a body without output_dir writes here
    target, draft = make_pair("EAGLE", "mixed", seed=4)
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), page_size=4)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as client:
        body = {"input_ids": [1, 5, 9, 3], "sampling_params": GREEDY}
        plain = client.post("/generate", json=body).json()["output_ids"]
        r = client.post("/start_profile", json={"output_dir": str(tmp_path / "a"), "num_steps": 2,
                                                "activities": ["CPU", "HOST"], "record_shapes": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert r.text.startswith("Start profiling (CPU, HOST) at step +0 for 2 steps:")
        assert client.post("/start_profile", json={}).status_code == 409  # one at a time
        assert client.post("/generate", json=body).json()["output_ids"] == plain
        live.wait_idle()
        files = sorted(p.name.split("-TP-0")[1] for p in (tmp_path / "a").iterdir())
        assert files == [".host.txt", ".ops.txt", ".trace.json.gz"]
        (trace,) = (tmp_path / "a").glob("*.trace.json.gz")
        assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        (host,) = (tmp_path / "a").glob("*.host.txt")
        assert "engine.py" in host.read_text()  # the engine's step, seen from the loop that ran it
        stopped = client.get("/stop_profile")
        assert stopped.status_code == 409 and "no profile is running" in stopped.json()["error"]["message"]

        r = client.get("/start_profile")  # GET, no body: SGLang's defaults (CPU without CUDA), until stopped
        assert r.status_code == 200 and r.text.startswith("Start profiling (CPU) at step +0:")
        client.post("/generate", json=body)
        r = client.post("/stop_profile")
        written = [Path(line) for line in r.text.splitlines()[1:]]
        assert r.status_code == 200 and [p.suffixes[-2:] for p in written] == [[".ops", ".txt"], [".json", ".gz"]]
        assert all(p.exists() and p.parent == tmp_path / "default" for p in written)
        r = client.post("/start_profile", json={"output_dir": str(tmp_path / "b"), "start_step": 10_000})
        assert r.status_code == 200
        r = client.post("/stop_profile")
        assert r.text == "Stop profiling: it had not begun (start_step), nothing written.\n"

        for bad, field in (({"activities": ["GPU"]}, "activities: GPU needs an engine on CUDA"),
                           ({"activities": ["RPD"]}, "activities"), ({"num_steps": 0}, "num_steps"),
                           ({"start_step": -1}, "start_step"), ({"merge_profiles": True}, "merge_profiles"),
                           ({"profile_by_stage": True}, "profile_by_stage"), ({"profile_prefix": "../x"}, "profile_prefix"),
                           ({"num_step": 3}, "num_step")):
            r = client.post("/start_profile", json=bad)
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), (bad, r.text)
        assert client.post("/generate", json=body).json()["output_ids"] == plain  # nothing lost
        live.wait_idle()
        assert live.engine_state(kv_is_free)
