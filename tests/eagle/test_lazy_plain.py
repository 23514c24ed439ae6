"""Lazy plain steps (prototype, ``specdec.eagle.stash``): plain steps stash their draft extend's inputs
and one extend over the stash runs when a request speculates next (or its stash is full). The draft
KV and root expansions then equal the per-step extends', so every verify step accepts exactly what
it accepts without the stash, token for token and step for step."""

from __future__ import annotations

import pytest

from ..e2e.helpers import assert_no_leak, make_pair, prompts_of
from ..e2e.test_adaptive import GREEDY, adaptive_engine


class Runs:
    """A policy stand-in: ``plain`` plain steps, then a run of ``spec`` steps of each shape in turn."""

    def __init__(self, shapes, plain: int, spec: int) -> None:
        self.shapes, self.plain, self.spec, self.i = list(shapes), plain, spec, 0

    def choose(self, bs, ctx):
        self.i += 1
        period = self.plain + self.spec
        k = self.i % period
        return None if k < self.plain else self.shapes[(self.i // period) % len(self.shapes)]

    def record(self, shape, committed, paths):
        pass

    def observe_step(self, name, bs, ctx, ms):
        pass


@pytest.mark.parametrize("plain,depth,overlap", [(3, 16, False), (5, 2, False), (4, 3, True)])  # depth < plain: fills
def test_lazy_plain_steps_accept_as_eager_ones(plain, depth, overlap, tmp_path):
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([5, 12, 3, 9], target.config.vocab_size, seed=4)
    params = [{**GREEDY, "max_new_tokens": n} for n in (30, 17, 41, 25)]
    results = []
    for lazy in (False, True):
        eng = adaptive_engine(target, draft, "EAGLE3", tmp_path, overlap_schedule=overlap,
                              speculative_lazy_plain=depth if lazy else 0)
        assert (eng.worker.base.stash is not None) == lazy
        eng.worker.policy = Runs(eng.worker.shapes, plain, 2)
        results.append(eng.generate(input_ids=prompts, sampling_params=params))
        assert_no_leak(eng)
    eager, lazy = results
    assert [g["output_ids"] for g in lazy] == [g["output_ids"] for g in eager]
    assert [g["meta_info"]["spec_accept_lengths"] for g in lazy] == [g["meta_info"]["spec_accept_lengths"] for g in eager]
    assert any(sum(g["meta_info"]["spec_accept_lengths"]) for g in eager)  # the drafts were accepted at all


def test_the_flag_needs_an_eagle_head():
    from specdec.engine.args import EngineArgs

    with pytest.raises(ValueError, match="--speculative-lazy-plain"):
        EngineArgs(model_path="m", speculative_algorithm="NGRAM", speculative_lazy_plain=4)
    with pytest.raises(ValueError, match="--speculative-lazy-plain"):
        EngineArgs(model_path="m", speculative_lazy_plain=-1)
