"""PagedKVMemory: worked examples, exact page-boundary truncation, and random operation sequences
checked against a plain Python model of page ownership."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec.engine.memory import OutOfRequestSlots, PagedKVMemory
from specdec.host import KVMemory, OutOfKVSlots, table_slots


def make(num_slots: int = 64, page_size: int = 4, max_reqs: int = 8, max_context_len: int = 64):
    return PagedKVMemory(
        num_slots=num_slots,
        page_size=page_size,
        max_reqs=max_reqs,
        max_context_len=max_context_len,
        device="cpu",
    )


def t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def extend(mem: PagedKVMemory, rows: list[int], prefix: list[int], ext: list[int]) -> list[int]:
    return mem.alloc_extend(t(rows), t(prefix), t(ext)).tolist()


def truncate(mem: PagedKVMemory, rows: list[int], old: list[int], new: list[int]) -> None:
    mem.truncate(t(rows), t(old), t(new))


def snapshot(mem: PagedKVMemory) -> tuple:
    return (mem.req_to_token.clone(), mem.available_size(), mem._page_free.copy())


def assert_same(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and (a[2] == b[2]).all()


def test_satisfies_protocol_and_shapes():
    mem = make(num_slots=48, page_size=16, max_reqs=3, max_context_len=40)
    assert isinstance(mem, KVMemory)
    assert mem.req_to_token.dtype == torch.int32
    assert tuple(mem.req_to_token.shape) == (3, 40)
    assert mem.capacity == 48 and mem.available_size() == 48 and mem.num_pages == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_slots=50, page_size=16), "multiple of page_size"),
        (dict(num_slots=0, page_size=1), "num_slots"),
        (dict(num_slots=16, page_size=0), "page_size"),
        (dict(num_slots=16, page_size=4, max_reqs=0), "max_reqs"),
    ],
)
def test_constructor_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_worked_example_page_size_4():
    """ps=4, 8 pages. Pages are handed out lowest first; partial last pages are filled first.

    row 0: positions 0..5           -> pages 0, 1  -> slots 0 1 2 3 | 4 5
    row 1: positions 0..2           -> page 2      -> slots 8 9 10
    then one batched extend:
    row 0: positions 6..8           -> page 1 (6, 7), fresh page 3  -> slots 6 7 | 12
    row 1: positions 3..4           -> page 2 (11), fresh page 4    -> slots 11 | 16
    """
    mem = make(num_slots=32, page_size=4)
    a, b = mem.alloc_req(), mem.alloc_req()
    assert (a, b) == (0, 1)
    assert extend(mem, [a], [0], [6]) == [0, 1, 2, 3, 4, 5]
    assert extend(mem, [b], [0], [3]) == [8, 9, 10]
    assert extend(mem, [a, b], [6, 3], [3, 2]) == [6, 7, 12, 11, 16]
    assert mem.req_to_token[a, :9].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12]
    assert mem.req_to_token[b, :5].tolist() == [8, 9, 10, 11, 16]
    assert mem.available_size() == 32 - 5 * 4
    # Filling a partial page takes no fresh page.
    assert mem.pages_needed([9], [3]) == 0 and mem.pages_needed([9], [4]) == 1
    assert extend(mem, [a], [9], [3]) == [13, 14, 15]
    assert mem.available_size() == 32 - 5 * 4
    # Truncating row 0 from 12 to 5 frees page 3 (positions 8..11) only: position 4 still uses
    # page 1.
    truncate(mem, [a], [12], [5])
    assert mem.available_size() == 32 - 4 * 4
    # The freed page 3 is the lowest free page again.
    assert extend(mem, [b], [5], [4]) == [17, 18, 19, 12]


@pytest.mark.parametrize(
    "new_len, old_len, freed_pages",
    [
        (17, 40, 1),  # the page of 16..31 stays: position 16 uses it; frees 32..39 only
        (16, 40, 2),  # frees 16..31 and 32..39
        (15, 40, 2),  # position 15 keeps page 0
        (0, 40, 3),
        (32, 40, 1),
        (33, 40, 0),
        (40, 40, 0),
        (31, 33, 1),  # frees only the page of position 32
        (1, 16, 0),
        (0, 1, 1),
    ],
)
def test_truncate_page_boundaries(new_len, old_len, freed_pages):
    mem = make(num_slots=160, page_size=16, max_context_len=64)
    row = mem.alloc_req()
    extend(mem, [row], [0], [old_len])
    before = mem.available_size()
    truncate(mem, [row], [old_len], [new_len])
    assert mem.available_size() - before == freed_pages * 16
    # Re-extending to old_len needs exactly the freed pages again and reuses them.
    assert mem.pages_needed([new_len], [old_len - new_len]) == freed_pages
    extend(mem, [row], [new_len], [old_len - new_len])
    assert mem.available_size() == before


@pytest.mark.parametrize("page_size", [1, 16])
def test_round_trip_returns_to_capacity(page_size):
    mem = make(num_slots=page_size * 64, page_size=page_size, max_context_len=100)
    rows = [mem.alloc_req() for _ in range(3)]
    lens = [7, 1, 30]
    slots = extend(mem, rows, [0, 0, 0], lens)
    assert len(slots) == sum(lens) and len(set(slots)) == sum(lens)
    extend(mem, rows, lens, [2, 0, 5])
    lens = [9, 1, 35]
    truncate(mem, rows, lens, [3, 1, 17])
    lens = [3, 1, 17]
    for row, n in zip(rows, lens):
        mem.free_request_tokens(row, n)
        mem.free_req(row)
    assert mem.available_size() == mem.capacity
    assert mem.num_free_reqs() == mem.max_reqs


def test_slots_in_one_page_are_consecutive():
    ps = 16
    mem = make(num_slots=ps * 12, page_size=ps, max_context_len=128)
    rows = [mem.alloc_req() for _ in range(3)]
    lens = [0, 0, 0]
    rng = random.Random(0)
    for _ in range(10):  # interleaved small extends scatter each request over many pages
        ext = [rng.randint(0, 7) for _ in rows]
        extend(mem, rows, lens, ext)
        lens = [a + b for a, b in zip(lens, ext)]
    for row, n in zip(rows, lens):
        slots = mem.req_to_token[row, :n].long()
        pos = torch.arange(n)
        page = slots // ps
        assert torch.equal(slots % ps, pos % ps)
        # positions in the same request page share one pool page
        for p in range((n + ps - 1) // ps):
            assert page[p * ps : (p + 1) * ps].unique().numel() == 1


def test_out_of_slots_is_all_or_nothing():
    mem = make(num_slots=32, page_size=4)
    a, b = mem.alloc_req(), mem.alloc_req()
    extend(mem, [a], [0], [6])  # pages 0, 1
    before = snapshot(mem)
    # row a fits (fills its page, needs 4 more pages), row b pushes it past the 6 free pages
    assert not mem.can_alloc([6, 0], [18, 12])
    with pytest.raises(OutOfKVSlots, match="pages"):
        extend(mem, [a, b], [6, 0], [18, 12])
    assert_same(before, snapshot(mem))
    assert mem.can_alloc([6, 0], [18, 8])
    extend(mem, [a, b], [6, 0], [18, 8])
    assert mem.available_size() == 0


def test_double_free_raises():
    mem = make(num_slots=32, page_size=4)
    row = mem.alloc_req()
    extend(mem, [row], [0], [10])
    truncate(mem, [row], [10], [4])
    before = snapshot(mem)
    with pytest.raises(RuntimeError, match="double free"):
        truncate(mem, [row], [10], [4])
    assert_same(before, snapshot(mem))
    # the same page listed twice in one call
    with pytest.raises(RuntimeError, match="double free"):
        truncate(mem, [row, row], [4, 4], [0, 0])
    assert_same(before, snapshot(mem))
    mem.free_request_tokens(row, 4)
    with pytest.raises(RuntimeError, match="double free"):
        mem.free_request_tokens(row, 4)
    mem.free_req(row)
    with pytest.raises(RuntimeError, match="already free"):
        mem.free_req(row)


def test_request_rows():
    mem = make(max_reqs=3)
    assert [mem.alloc_req() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OutOfRequestSlots):
        mem.alloc_req()
    mem.free_req(1)
    assert mem.alloc_req() == 1
    mem.free_req(0)
    with pytest.raises(ValueError, match="alloc_req"):
        extend(mem, [0], [0], [1])


def test_bad_arguments():
    mem = make(max_context_len=10)
    row = mem.alloc_req()
    with pytest.raises(ValueError, match="max_context_len"):
        extend(mem, [row], [0], [11])
    with pytest.raises(ValueError, match="new_len <= old_len"):
        truncate(mem, [row], [0], [1])
    assert mem.alloc_extend(t([]), t([]), t([])).numel() == 0
    assert extend(mem, [row], [0], [0]) == []
    assert mem.available_size() == mem.capacity


class Model:
    """Page ownership in plain Python: each request is a list of pages; free pages a set."""

    def __init__(self, num_pages: int, ps: int) -> None:
        self.ps = ps
        self.free = set(range(num_pages))
        self.pages: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def need(self, row: int, ext: int) -> int:
        n = self.lens[row]
        return -(-(n + ext) // self.ps) - -(-n // self.ps)

    def extend(self, rows: list[int], exts: list[int]) -> list[int]:
        taken = sorted(self.free)[: sum(self.need(r, e) for r, e in zip(rows, exts))]
        self.free -= set(taken)
        out = []
        for row, ext in zip(rows, exts):
            k = self.need(row, ext)
            self.pages[row] += taken[:k]
            taken = taken[k:]
            out += [self.slot(row, i) for i in range(self.lens[row], self.lens[row] + ext)]
            self.lens[row] += ext
        return out

    def truncate(self, row: int, new: int) -> None:
        keep = -(-new // self.ps)
        self.free |= set(self.pages[row][keep:])
        self.pages[row] = self.pages[row][:keep]
        self.lens[row] = new

    def slot(self, row: int, pos: int) -> int:
        return self.pages[row][pos // self.ps] * self.ps + pos % self.ps


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_sequences_match_model(page_size, seed):
    rng = random.Random(seed)
    num_pages, max_reqs, max_len = 24, 6, 6 * page_size + 5
    mem = make(
        num_slots=num_pages * page_size,
        page_size=page_size,
        max_reqs=max_reqs,
        max_context_len=max_len,
    )
    model = Model(num_pages, page_size)
    for _ in range(150):
        op = rng.random()
        live = sorted(model.lens)
        if op < 0.2 and len(live) < max_reqs:
            row = mem.alloc_req()
            assert row == min(set(range(max_reqs)) - set(live))
            model.pages[row], model.lens[row] = [], 0
        elif op < 0.6 and live:
            rows = rng.sample(live, rng.randint(1, len(live)))
            room = [max_len - model.lens[r] for r in rows]
            exts = [rng.randint(0, min(2 * page_size + 1, r)) for r in room]
            prefix = [model.lens[r] for r in rows]
            need = sum(model.need(r, e) for r, e in zip(rows, exts))
            assert mem.pages_needed(prefix, exts) == need
            if need > len(model.free):
                before = snapshot(mem)
                with pytest.raises(OutOfKVSlots):
                    extend(mem, rows, prefix, exts)
                assert_same(before, snapshot(mem))
            else:
                assert extend(mem, rows, prefix, exts) == model.extend(rows, exts)
        elif op < 0.85 and live:
            rows = rng.sample(live, rng.randint(1, len(live)))
            old = [model.lens[r] for r in rows]
            new = [rng.randint(0, n) for n in old]
            truncate(mem, rows, old, new)
            for r, n in zip(rows, new):
                model.truncate(r, n)
        elif live:
            row = rng.choice(live)
            mem.free_request_tokens(row, model.lens[row])
            mem.free_req(row)
            model.truncate(row, 0)
            del model.pages[row], model.lens[row]
        assert mem.available_size() == len(model.free) * page_size
        for row, n in model.lens.items():
            expect = [model.slot(row, i) for i in range(n)]
            assert mem.req_to_token[row, :n].tolist() == expect
    for row, n in list(model.lens.items()):
        mem.free_request_tokens(row, n)
        mem.free_req(row)
    assert mem.available_size() == mem.capacity
    assert mem.num_free_reqs() == max_reqs


def test_large_pool_alloc_is_vectorised():
    # 2**20 single-slot pages: per-call work must be tensor ops, not Python loops over the pool.
    mem = make(num_slots=1 << 20, page_size=1, max_reqs=4, max_context_len=1 << 20)
    row = mem.alloc_req()
    slots = mem.alloc_extend(t([row]), t([0]), t([1 << 19]))
    assert torch.equal(slots, torch.arange(1 << 19))
    mem.truncate(t([row]), t([1 << 19]), t([1]))
    assert mem.available_size() == (1 << 20) - 1


@pytest.mark.parametrize("page_size", [1, 4])
def test_pages_are_the_lowest_free_ones_without_scanning_the_pool(page_size):
    """Under random allocations and frees, the windowed search from ``_first_free`` finds exactly
    the lowest free pages, as a scan of the whole pool would, and every page below it is taken."""
    rng = random.Random(0)
    mem = make(num_slots=20000 * page_size, page_size=page_size, max_reqs=16, max_context_len=4096)
    lens: dict[int, int] = {}  # row -> tokens held
    for _ in range(400):
        if lens and rng.random() < 0.35:  # a request ends (or is cut back)
            row = rng.choice(list(lens))
            new = rng.choice([0, rng.randrange(lens[row] + 1)])
            truncate(mem, [row], [lens[row]], [new])
            lens[row] = new
            if new == 0:
                mem.free_req(row)
                del lens[row]
            continue
        grow = lens and (rng.random() < 0.5 or mem.num_free_reqs() == 0)
        row = rng.choice(list(lens)) if grow else mem.alloc_req()
        held, ext = lens.get(row, 0), rng.randrange(1, 300)
        if held + ext > 4096:
            continue
        need = mem.pages_needed([held], [ext])
        assert mem._lowest_free_pages(need).tolist() == np.flatnonzero(mem._page_free)[:need].tolist()
        extend(mem, [row], [held], [ext])
        lens[row] = held + ext
        assert not mem._page_free[:mem._first_free].any()


@pytest.mark.parametrize("tokens", [1, 4])
def test_table_slots_read_the_reserved_positions_of_each_row(tokens):
    """``table_slots`` (flat indices into the table) equals indexing the table at [row, seq_len + t]."""
    gen = torch.Generator().manual_seed(tokens)
    req_to_token = torch.randint(0, 10_000, (9, 64), dtype=torch.int32, generator=gen)
    rows = torch.tensor([3, 0, 8, 3, 5])
    seq_lens = torch.randint(0, 64 - tokens + 1, (5,), generator=gen)
    expected = torch.stack([req_to_token[r, s : s + tokens] for r, s in zip(rows, seq_lens)]).flatten().long()
    got = table_slots(req_to_token, rows, seq_lens, tokens)
    assert got.dtype == torch.int64 and torch.equal(got, expected)
