"""RadixCache: the worked examples of its docstring, locks and LRU eviction, and random operation
sequences checked against a plain model (a dict from cached key prefixes to pages)."""

from __future__ import annotations

import random

import pytest

from specdec.engine.radix_cache import RadixCache


def keys(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_docstring_example_page_size_2():
    """root ── [a b | c d] (4, 9) ──┬── [e f] (2)
                                    └── [x y | z w] (5, 1)"""
    tree = RadixCache(page_size=2)
    assert tree.insert(keys("abcdef"), [4, 9, 2]).pages == [4, 9, 2]
    assert tree.insert(keys("abcdxyzw"), [7, 8, 5, 1]).pages == [4, 9, 5, 1]  # 7, 8: duplicates
    assert tree.match(keys("abcdxyq")).pages == [4, 9, 5]
    assert tree.insert(keys("abcexx"), [4, 7, 8]).pages == [4, 7, 8]  # splits (4, 9) after page 4
    assert tree.insert(keys("abcdef"), [3, 6, 8]).pages == [4, 9, 2]
    assert sorted(tree.pages()) == [1, 2, 4, 5, 7, 8, 9]
    assert tree.evictable_pages == 7 and tree.locked_pages == 0


def test_match_ignores_a_partial_page_and_empty_keys():
    tree = RadixCache(page_size=4)
    tree.insert(keys("abcdefgh"), [0, 1])
    assert tree.match(keys("abcdefg")).pages == [0]  # "efg" is not a whole page
    assert tree.match(keys("abc")).pages == []
    assert tree.match([]).pages == []
    assert tree.match(keys("xbcdefgh")).pages == []


def test_insert_rejects_keys_that_are_not_whole_pages():
    with pytest.raises(ValueError, match="keys for"):
        RadixCache(page_size=2).insert(keys("abc"), [0])


def test_locked_prefix_is_never_evicted_and_unlock_balances():
    """"ab|cd" locked through its "cd" node: evicting everything leaves exactly those pages."""
    tree = RadixCache(page_size=2)
    tree.insert(keys("abcd"), [0, 1])
    tree.insert(keys("abxy"), [0, 2])
    node = tree.match(keys("abcd")).node
    tree.lock(node)
    assert tree.locked_pages == 2 and tree.evictable_pages == 1
    assert tree.evict(10) == [2]
    assert sorted(tree.pages()) == [0, 1]
    tree.unlock(node)
    assert tree.locked_pages == 0 and tree.evictable_pages == 2
    assert sorted(tree.evict(10)) == [0, 1] and tree.pages() == []
    with pytest.raises(RuntimeError, match="unbalanced"):
        tree.unlock(node)


def test_unlocked_pages_are_what_a_lock_takes_from_the_evictable():
    """root ── [a b] (0) ──┬── [c d] (1)      "abxy" locked: locking "abcd" takes only page 1
                           └── [x y] (2)"""
    tree = RadixCache(page_size=2)
    tree.insert(keys("abcd"), [0, 1])
    tree.insert(keys("abxy"), [0, 2])
    abcd, abxy = tree.match(keys("abcd")).node, tree.match(keys("abxy")).node
    assert tree.unlocked_pages(abcd) == 2 and tree.unlocked_pages(tree.root) == 0
    tree.lock(abxy)
    assert tree.unlocked_pages(abcd) == 1 and tree.unlocked_pages(abxy) == 0
    before = tree.evictable_pages
    tree.lock(abcd)
    assert before - tree.evictable_pages == 1


def test_eviction_is_least_recently_used_first():
    tree = RadixCache(page_size=1)
    for text, page in (("a", 0), ("b", 1), ("c", 2)):
        tree.insert(keys(text), [page])
    tree.match(keys("a"))  # "a" is now the most recently used
    assert tree.evict(1) == [1]
    assert tree.evict(1) == [2]
    assert tree.evict(1) == [0]


def test_eviction_climbs_to_parents_that_become_leaves():
    """Evicting leaf "cd" (page 1) makes "ab" (page 0) a leaf, evictable in the same call."""
    tree = RadixCache(page_size=2)
    tree.insert(keys("abcd"), [0, 1])
    tree.insert(keys("ab"), [0])  # splits the node: "ab" now has child "cd"
    assert tree.evict(2) == [1, 0]


def test_split_keeps_locks_on_both_parts():
    tree = RadixCache(page_size=1)
    tree.insert(keys("abc"), [0, 1, 2])
    leaf = tree.match(keys("abc")).node
    tree.lock(leaf)
    tree.insert(keys("abx"), [0, 1, 3])  # splits "abc" after "ab" while it is locked
    assert tree.locked_pages == 3 and tree.evictable_pages == 1
    assert tree.evict(5) == [3]
    tree.unlock(leaf)
    assert tree.locked_pages == 0 and tree.evictable_pages == 3


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_a_plain_model(page_size, seed):
    """Inserts, matches, locks and evictions over a 3-letter alphabet (many shared prefixes).

    The model: every cached whole-page key prefix -> its page. A match must return the pages of
    the longest cached prefix; locked prefixes must survive eviction; pages are never shared
    between distinct prefixes."""
    rng = random.Random(seed)
    tree = RadixCache(page_size)
    model: dict[tuple[int, ...], int] = {}  # key prefix (whole pages) -> page of its last page
    next_page = 0
    locks: list[tuple[object, tuple[int, ...]]] = []
    for _ in range(300):
        op = rng.random()
        text = tuple(rng.choice((1, 2, 3)) for _ in range(rng.randint(0, 4) * page_size))
        if op < 0.45:  # insert with fresh pages where the model has none
            pages, given = [], []
            for i in range(0, len(text), page_size):
                prefix = text[: i + page_size]
                cached = prefix in model
                if not cached:
                    model[prefix] = next_page
                    next_page += 1
                pages.append(model[prefix])
                # a cached page given again may come under another id (a recomputed duplicate)
                given.append(10_000 + model[prefix] if cached and rng.random() < 0.5 else model[prefix])
            assert tree.insert(list(text), given).pages == pages
        elif op < 0.7:  # match
            want = []
            for i in range(0, len(text) - page_size + 1, page_size):
                page = model.get(text[: i + page_size])
                if page is None:
                    break
                want.append(page)
            assert tree.match(list(text)).pages == want
        elif op < 0.85:  # lock a matched prefix, or unlock one
            if locks and rng.random() < 0.5:
                node, _ = locks.pop(rng.randrange(len(locks)))
                tree.unlock(node)
            else:
                match = tree.match(list(text))
                tree.lock(match.node)
                locks.append((match.node, text[: len(match) * page_size]))
        else:  # evict some pages: never a locked prefix
            freed = tree.evict(rng.randint(1, 4))
            for prefix, page in list(model.items()):
                if page in freed:
                    del model[prefix]
            for _, prefix in locks:
                for i in range(page_size, len(prefix) + 1, page_size):
                    assert prefix[:i] in model, "a locked prefix was evicted"
        assert sorted(tree.pages()) == sorted(model.values())
        assert tree.total_pages == len(model)
    for node, _ in locks:
        tree.unlock(node)
    assert tree.locked_pages == 0
    assert sorted(tree.reset()) == sorted(model.values()) and tree.pages() == []
