"""RadixPrefixCache's hand-over of a request's pages: positions the tree already holds are computed again
by a later request (the same prompt and output), and the duplicates go back to the pool, whether the
request keeps running (its row re-pointed at the tree's pages) or leaves."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.engine.memory import PagedKVMemory
from specdec.engine.prefix_cache import RadixPrefixCache

PROMPT = [5, 9, 2, 7, 7, 3, 8, 1]
OUTPUT = [4, 6, 6, 2, 9, 5]


def _pool(page_size):
    memory = PagedKVMemory(num_slots=256, page_size=page_size, max_reqs=4, max_context_len=64, device="cpu")
    return memory, RadixPrefixCache(memory)


def _compute(memory, cache, tokens):
    """A request over ``tokens``: its cached prefix, then KV slots for the rest, as a prefill and decode give."""
    row = memory.alloc_req()
    cached = cache.acquire(row, tokens[:len(PROMPT)])
    kv_len = len(tokens) - 1
    memory.alloc_extend([row], [cached], [kv_len - cached])
    return row, kv_len


def _pages_accounted(memory, cache):
    return memory.num_free_pages() + len(set(cache.pages())) == memory.num_pages


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_leaving_request_gives_its_duplicates_back(page_size):
    memory, cache = _pool(page_size)
    tokens = PROMPT + OUTPUT
    first, kv_len = _compute(memory, cache, tokens)
    cache.release_request(first, tokens, kv_len, kv_len)
    memory.free_req(first)
    held = sorted(cache.pages())
    assert held and _pages_accounted(memory, cache)

    again, kv_len = _compute(memory, cache, tokens)  # the prompt from the cache, the output computed again
    free_before = memory.num_free_pages()
    computed = (kv_len + page_size - 1) // page_size - (len(PROMPT) - 1) // page_size
    cache.release_request(again, tokens, kv_len, kv_len)
    memory.free_req(again)
    assert sorted(cache.pages()) == held  # the tree kept its own copy
    assert memory.num_free_pages() == free_before + computed  # every page the request computed is back
    assert _pages_accounted(memory, cache) and cache.locked_pages == 0

    third = memory.alloc_req()  # a later request maps the tree's pages
    cached = cache.acquire(third, tokens)
    assert cached == len(held) * page_size
    assert sorted(memory.row_pages(third, 0, len(held)).tolist()) == held


def test_a_running_request_is_pointed_at_the_tree_pages():
    memory, cache = _pool(1)
    tokens = PROMPT + OUTPUT
    first, kv_len = _compute(memory, cache, tokens)
    cache.release_request(first, tokens, kv_len, kv_len)
    memory.free_req(first)
    again, kv_len = _compute(memory, cache, tokens)
    own = memory.row_pages(again, 0, kv_len)
    cache.cache_request(again, tokens, kv_len)  # it keeps running: its row now reads the tree's pages
    mapped = memory.row_pages(again, 0, kv_len)
    assert sorted(mapped.tolist()) == sorted(cache.pages())
    assert not np.isin(own[len(PROMPT) - 1:], mapped).any()  # its own copies left the row
    assert memory.req_to_token[again, :kv_len].tolist() == mapped.tolist()  # on the device too
    cache.release_request(again, tokens, kv_len, kv_len)
    memory.free_req(again)
    assert _pages_accounted(memory, cache) and cache.locked_pages == 0
