"""EngineMetrics.observe_verify: one call with a step's accept lengths counts what one call a request
counted (the server now calls it once a step)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from specdec.server.metrics import EngineMetrics  # noqa: E402


def samples(metrics: EngineMetrics) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples
            if "spec" in s.name and not s.name.endswith("_created")}


def test_one_call_a_step_counts_as_one_call_a_request():
    steps = [[2, 0, 3], [1], [], [4, 4, 0, 1]]  # a step's accept lengths, one a request; depth 4 > 3 positions
    batched, single = EngineMetrics(num_draft_positions=3), EngineMetrics(num_draft_positions=3)
    for step in steps:
        batched.observe_verify(step)
        for k in step:
            single.observe_verify([k])
    got = samples(batched)
    assert got == samples(single)
    assert got[("specdec:spec_verify_steps_total", ())] == 8
    assert got[("specdec:spec_accept_length", ())] == pytest.approx((2 + 0 + 3 + 1 + 4 + 4 + 0 + 1 + 8) / 8)
    assert got[("specdec:spec_accept_rate", (("position", "4"),))] == pytest.approx(2 / 8)
