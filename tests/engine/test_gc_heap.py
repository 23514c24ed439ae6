"""``frozen_heap`` keeps a built engine out of the collector's passes, and gives it back after;
``GCPauses`` counts the collections of a span."""

import gc

from specdec.engine.gc_heap import GCPauses, frozen_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_frozen_heap_skips_what_lived_before_and_collects_what_came_after():
    before = [Node() for _ in range(1000)]
    with frozen_heap():
        assert gc.get_freeze_count() >= 1000
        del before  # frozen cycles outlive a collection
        assert gc.collect() == 0
        later = Node()
        del later  # a cycle made after the freeze is still collected
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0
    assert gc.collect() >= 1000  # unfrozen: the old cycles go


def test_gc_pauses_counts_collections_by_generation():
    with GCPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    assert pauses.counts[0] >= 1 and pauses.counts[2] >= 2
    record = pauses.to_json()
    assert record["collections"] == pauses.counts and all(p >= 0 for p in record["pause_ms"])
    gc.collect(2)
    assert pauses.counts[2] == record["collections"][2]  # no longer listening
