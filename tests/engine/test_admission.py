"""``chunk_request``: a prompt's next prefill chunk, cut where the backend's ``ChunkRule`` allows and the
budget reaches."""

import pytest

from specdec.attention.base import ChunkRule
from specdec.engine.admission import chunk_request

TOKENS = list(range(100))


@pytest.mark.parametrize("start, budget, rule, end", [
    (0, 1000, ChunkRule(16, 20), 100),  # the rest fits: the whole rest, whatever the rule
    (90, 10, ChunkRule(16, 20), 100),
    (0, 48, ChunkRule(16, 1), 48),  # a cut on a boundary
    (0, 43, ChunkRule(16, 1), 32),  # back to the last boundary within the budget
    (5, 43, ChunkRule(16, 1), 48),  # boundaries are positions, not lengths
    (37, 43, ChunkRule(), 80),  # no rule: where the budget ends
    (0, 43.9, ChunkRule(), 43),
    (0, 90, ChunkRule(16, 20), 80),  # 80 leaves 20
    (0, 90, ChunkRule(16, 21), 64),  # 80 would leave 20 < 21: back to 64
    (10, 60, ChunkRule(16, 20), 64),  # 54 new, 36 left
])
def test_a_chunk_ends_at_the_last_position_the_rule_and_budget_allow(start, budget, rule, end):
    chunk = chunk_request("req", TOKENS, start, budget, rule)
    assert (chunk.start, chunk.end, chunk.is_last) == (start, end, end == len(TOKENS))


@pytest.mark.parametrize("start, budget, rule", [
    (33, 14, ChunkRule(16, 1)),  # 33 + 14 = 47 < 48: no boundary
    (33, 30, ChunkRule(16, 20)),  # the boundary at 48 leaves a chunk of 15 < 20
    (30, 60, ChunkRule(16, 45)),  # a cut leaving 45 is at 48 or before: a chunk of 18 < 45
])
def test_no_chunk_when_the_rule_allows_no_cut_within_the_budget(start, budget, rule):
    assert chunk_request("req", TOKENS, start, budget, rule) is None


def test_a_full_budget_always_finds_a_cut():
    """The scheduler keeps a rule only where its chunk size is >= 2 * least + align: from any start, a full
    budget then reaches a cut that leaves both sides at least ``least``."""
    rule = ChunkRule(16, 20)
    budget = 2 * rule.least + rule.align
    for start in range(0, len(TOKENS) - budget):
        chunk = chunk_request("req", TOKENS, start, budget, rule)
        assert chunk is not None and (chunk.is_last or chunk.end % rule.align == 0)
        assert chunk.length >= rule.least and (chunk.is_last or len(TOKENS) - chunk.end >= rule.least)
