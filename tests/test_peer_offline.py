"""``benchmarks/peer/offline.py``'s diagnostics on specdec's NGRAM engine (CPU): ``--force plain`` makes
every decode step plain and labels it so, ``auto`` hands the choice back to the policy (whose picks
label the steps), a tree shape is refused by name, and ``--answers`` records what each timed cell answered."""

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from tests.e2e.helpers import make_pair
from tests.e2e.test_ngram import ngram_engine, repetitive_prompts

SPEC = importlib.util.spec_from_file_location(
    "peer_offline_force", Path(__file__).resolve().parents[1] / "benchmarks" / "peer" / "offline.py")
offline = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(offline)


def _bench_engine():
    """offline.SpecdecEngine around an NGRAM engine of the tests' tiny pair (adaptive on)."""
    target, _ = make_pair("EAGLE", "mixed")
    bench = offline.SpecdecEngine.__new__(offline.SpecdecEngine)
    bench.engine = ngram_engine(target, speculative_adaptive="on")
    bench.tokenizer, bench.reqs, bench.texts = None, {}, {}
    bench.step_log = offline.StepLog(bench.engine)
    return bench, repetitive_prompts(target.config.vocab_size)


def _decode_all(bench, prompts, tag):
    for i, ids in enumerate(prompts):
        bench.add(f"{tag}{i}", ids, 24, ignore_eos=True)
    while bench.engine.scheduler.has_work:
        bench.step()
    return {kind for kind in bench.step_log.take() if kind != "prefill"}


def test_forced_plain_then_auto():
    bench, prompts = _bench_engine()
    bench.force("plain")
    assert bench.engine.worker.force == 0
    assert _decode_all(bench, prompts, "p") == {"plain"}
    assert bench.engine.worker.policy.chosen == {}  # the policy was never asked
    bench.force("auto")
    assert bench.engine.worker.force is None
    kinds = _decode_all(bench, prompts, "a")
    picks = set(bench.engine.worker.policy.chosen)
    assert picks and kinds - {"decode"} == picks  # labelled by the policy's picks ("decode": steps it was not asked)
    with pytest.raises(SystemExit, match="--force"):
        bench.force("3x1x4")


def test_answers_record_each_cells_prompts_and_answers(tmp_path, monkeypatch):
    """``--answers``: a timed cell appends its prompts and the answers whose digests its row reports."""
    bench, prompts = _bench_engine()
    path = tmp_path / "answers.jsonl"
    monkeypatch.setattr(offline, "ANSWERS", str(path))
    rows = []
    offline.run_cell(bench, prompts, 1, last=False, force="auto", workload="w", max_tokens=12, emit=rows.append)
    (cell,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert cell["workload"] == "w" and cell["concurrency"] == 1 and cell["prompts"] == offline.cell_work(prompts, 1)
    assert [hashlib.sha1(json.dumps(a).encode()).hexdigest()[:12] for a in cell["answers"]] == rows[0]["digests"]
    assert all(0 < len(a) <= 12 for a in cell["answers"])


def test_one_request_cells_take_the_first_prompts(monkeypatch):
    """``--one-request-prompts``: a one-request cell's prompts, the first of the set; larger cells unchanged."""
    prompts = [[i] for i in range(20)]
    assert offline.cell_work(prompts, 1) == prompts[:8]
    monkeypatch.setattr(offline, "ONE_REQUEST_PROMPTS", 16)
    assert offline.cell_work(prompts, 1) == prompts[:16]
    assert offline.cell_work(prompts, 4) == prompts and len(offline.cell_work(prompts, 32)) == 64


def test_flush_prefix_cache_drops_what_the_answers_cached():
    """Before the MT-bench second turns, the engine that wrote the first answers drops their KV (its decode
    steps' bits), so that it prefills the first turns as the engines reading the answers do."""
    bench, prompts = _bench_engine()
    _decode_all(bench, prompts, "t")
    assert bench.engine.scheduler.cache.cached_pages > 0
    bench.flush_prefix_cache()
    assert bench.engine.scheduler.cache.cached_pages == 0
