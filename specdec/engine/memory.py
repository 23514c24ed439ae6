"""PagedKVMemory: the reference host's request-to-token table and paged KV slot allocator.

Implements ``specdec.host.KVMemory``. KV slots are grouped into pages of ``page_size`` consecutive
slots: page ``p`` owns slots ``p * page_size .. p * page_size + page_size - 1``. Position ``i`` of
a request lives in the request's ``i // page_size``-th page at offset ``i % page_size``, so the
slots of a request's positions that share a page are consecutive. With page_size = 4::

    positions     0  1  2  3 | 4  5  6  7 | 8  9
    page          7  7  7  7 | 2  2  2  2 | 5  5      (pages handed out lowest-free-first)
    req_to_token 28 29 30 31 | 8  9 10 11 |20 21

    alloc_extend(prefix_len=10, extend_len=3) fills positions 10, 11 into page 5 (slots 22, 23)
    and takes one fresh page for position 12.
    truncate(old_len=13, new_len=9) frees only the page holding position 12: position 8 still
    uses page 5.

Glossary: page_size = slots per page; a request *row* is its row in ``req_to_token``.

Allocator state (which pages and rows are free) lives on the CPU as numpy bool masks and is
changed only by whole validated operations: every call either succeeds or raises having changed
nothing. ``req_to_token`` lives on ``device``, with a CPU mirror that only this class writes, so
allocating and freeing never read the device (no host sync while the GPU works); the bookkeeping
is numpy because it runs on the host between CUDA-graph replays, where torch's per-op cost on
small CPU tensors would dominate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specdec.host import OutOfKVSlots

Lens = torch.Tensor | Sequence[int] | np.ndarray


class OutOfRequestSlots(RuntimeError):
    """Every row of the request-to-token table is taken."""


class PagedKVMemory:
    def __init__(
        self,
        *,
        num_slots: int,
        page_size: int,
        max_reqs: int,
        max_context_len: int,
        device: torch.device | str,
    ) -> None:
        for name, value in (
            ("num_slots", num_slots),
            ("page_size", page_size),
            ("max_reqs", max_reqs),
            ("max_context_len", max_context_len),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PagedKVMemory: {name} must be an int >= 1, got {value!r}")
        if num_slots % page_size != 0:
            raise ValueError(
                f"PagedKVMemory: num_slots={num_slots} must be a multiple of page_size={page_size}"
            )
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # [max_reqs, max_context_len] int32: KV slot of each (request row, position)
        self.req_to_token = torch.zeros(
            (max_reqs, max_context_len), dtype=torch.int32, device=self.device
        )
        # the same table on the CPU (equal to req_to_token wherever this class wrote it)
        self._table = np.zeros((max_reqs, max_context_len), dtype=np.int32)
        # [num_pages] True = free. Lowest free page first keeps allocation deterministic.
        self._page_free = np.ones(self.num_pages, dtype=bool)
        self._num_free_pages = self.num_pages
        # every page below this one is taken: the search for free pages starts here
        self._first_free = 0
        # [max_reqs] True = free row
        self._row_free = np.ones(max_reqs, dtype=bool)

    # ------------------------------------------------------------------ sizes
    @property
    def capacity(self) -> int:
        """Total KV slots (free or not)."""
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        """Free KV slots (= free pages * page_size)."""
        return self._num_free_pages * self.page_size

    def num_free_pages(self) -> int:
        return self._num_free_pages

    def num_free_reqs(self) -> int:
        return int(self._row_free.sum())

    def pages_needed(self, prefix_lens: Lens, extend_lens: Lens) -> int:
        """Fresh pages ``alloc_extend`` would take for these requests ([bs] each)."""
        prefix, extend = _host_lens(prefix_lens), _host_lens(extend_lens)
        return int(self._new_pages_per_req(prefix, prefix + extend).sum())

    def can_alloc(self, prefix_lens: Lens, extend_lens: Lens) -> bool:
        """Whether ``alloc_extend`` with these lengths would succeed for lack of pages."""
        return self.pages_needed(prefix_lens, extend_lens) <= self._num_free_pages

    # ------------------------------------------------------------ request rows
    def alloc_req(self) -> int:
        """Take the lowest free row of ``req_to_token``."""
        free = np.flatnonzero(self._row_free)
        if free.size == 0:
            raise OutOfRequestSlots(f"all {self.max_reqs} request rows are in use")
        row = int(free[0])
        self._row_free[row] = False
        return row

    def free_req(self, row: int) -> None:
        """Return a row. Its KV pages are released separately (``free_request_tokens``)."""
        if not 0 <= row < self.max_reqs:
            raise ValueError(f"request row {row} is out of range [0, {self.max_reqs})")
        if bool(self._row_free[row]):
            raise RuntimeError(f"request row {row} is already free (double free)")
        self._row_free[row] = True

    def free_request_tokens(self, row: int, seq_len: int) -> None:
        """Release every page holding positions [0, seq_len) of request ``row``."""
        self.truncate([row], [seq_len], [0])

    # ---------------------------------------------------------------- KVMemory
    def alloc_extend(self, req_pool_indices: Lens, prefix_lens: Lens, extend_lens: Lens) -> torch.Tensor:
        """Give positions [prefix_len, prefix_len + extend_len) of each request KV slots.

        Fills each request's partially used last page first, then takes fresh pages (lowest
        first), writes the slots into ``req_to_token`` and returns them packed request by request:
        [sum(extend_lens)] int64 on ``device``. Raises ``OutOfKVSlots`` having changed nothing.
        Lengths may be tensors (on any device: a device tensor is read once) or int sequences.
        """
        rows, prefix, extend = (_host_lens(x) for x in (req_pool_indices, prefix_lens, extend_lens))
        self._check_rows(rows, prefix, extend)
        end = prefix + extend
        if end.size and int(end.max()) > self.max_context_len:
            raise ValueError(
                f"alloc_extend: a request would reach {int(end.max())} tokens, past "
                f"max_context_len={self.max_context_len}"
            )
        new_per_req = self._new_pages_per_req(prefix, end)  # [bs]
        total_new = int(new_per_req.sum())
        if total_new > self._num_free_pages:
            raise OutOfKVSlots(
                f"need {total_new} pages ({total_new * self.page_size} slots) but only "
                f"{self._num_free_pages} pages ({self.available_size()} slots) are free"
            )
        new_pages = self._lowest_free_pages(total_new)  # [total_new]
        token_rows = np.repeat(rows, extend)  # [num_tokens]
        positions = _packed_positions(prefix, extend)  # [num_tokens]
        slots = self._slots_for(rows, prefix, extend, token_rows, positions, new_pages, new_per_req)
        # All checks passed: commit.
        self._page_free[new_pages] = False
        self._num_free_pages -= total_new
        if total_new:
            self._first_free = int(new_pages[-1]) + 1
        self._table[token_rows, positions] = slots
        # one host-to-device copy carries rows, positions and slots
        packed = host_to_device(torch.from_numpy(np.stack([token_rows, positions, slots])), self.device)
        self.req_to_token[packed[0], packed[1]] = packed[2].to(torch.int32)
        return packed[2]

    def truncate(self, req_pool_indices: Lens, old_lens: Lens, new_lens: Lens) -> None:
        """Release positions [new_len, old_len) of each request: frees the pages no position
        < new_len uses, i.e. the request's pages ceil(new_len / ps) .. ceil(old_len / ps) - 1.

        NOTE: the page holding position new_len - 1 stays even if positions after it are
        released; a later ``alloc_extend`` refills it. The pages are found through the table,
        so old_len must not exceed what was allocated for the row.
        """
        rows, old, new = (_host_lens(x) for x in (req_pool_indices, old_lens, new_lens))
        if not rows.shape == old.shape == new.shape:
            raise ValueError(
                f"truncate: req_pool_indices, old_lens, new_lens must all be [bs], got "
                f"{tuple(rows.shape)}, {tuple(old.shape)}, {tuple(new.shape)}"
            )
        if rows.size == 0:
            return
        if bool((new > old).any()) or bool((new < 0).any()):
            raise ValueError(f"truncate: need 0 <= new_len <= old_len, got new={new.tolist()} old={old.tolist()}")
        if bool((old > self.max_context_len).any()):
            raise ValueError(f"truncate: old_len past max_context_len={self.max_context_len}")
        ps = self.page_size
        first = (new + ps - 1) // ps  # [bs] first request page to free
        count = (old + ps - 1) // ps - first  # [bs] pages to free
        total = int(count.sum())
        if total == 0:
            return
        # The k-th freed page of a request is the page of its position (first + k) * ps.
        page_rows = np.repeat(rows, count)
        page_idx = np.repeat(first, count) + _packed_positions(np.zeros_like(count), count)
        pages = self._table[page_rows, page_idx * ps].astype(np.int64) // ps  # [total]
        if bool((pages < 0).any()) or bool((pages >= self.num_pages).any()):
            raise RuntimeError("truncate: req_to_token holds a slot outside the pool")
        if np.unique(pages).size != total or bool(self._page_free[pages].any()):
            raise RuntimeError("truncate: a page would be freed twice (double free)")
        self._mark_free(pages)

    # ------------------------------------------------------------ shared pages
    # A prefix cache (specdec.engine.prefix_cache) owns pages beyond any one request: it maps
    # cached pages into a request's row, takes a finished request's pages over, and frees pages.
    def row_pages(self, row: int, first: int, count: int) -> np.ndarray:
        """Pages ``first .. first + count - 1`` of request ``row`` (request-local page indices)."""
        ps = self.page_size
        return self._table[row, np.arange(first, first + count) * ps].astype(np.int64) // ps

    def map_pages(self, row: int, first: int, pages: Sequence[int] | np.ndarray) -> None:
        """Point request ``row``'s pages ``first, first + 1, ...`` at ``pages`` (already taken:
        cached ones): every position of those pages gets its slot in ``req_to_token``."""
        pages = np.asarray(pages, dtype=np.int64)
        if pages.size == 0:
            return
        ps = self.page_size
        if (first + pages.size) * ps > self.max_context_len:
            raise ValueError(f"map_pages: {first + pages.size} pages pass max_context_len={self.max_context_len}")
        if bool(self._page_free[pages].any()):
            raise RuntimeError("map_pages: a mapped page is free")
        positions = np.arange(first * ps, (first + pages.size) * ps)  # [pages * ps]
        slots = np.repeat(pages * ps, ps) + positions % ps
        self._table[row, positions] = slots
        packed = host_to_device(torch.from_numpy(np.stack([positions, slots])), self.device)
        self.req_to_token[row, packed[0]] = packed[1].to(torch.int32)

    def free_pages(self, pages: Sequence[int] | np.ndarray) -> None:
        """Return pages to the pool (pages no request row maps any more)."""
        pages = np.asarray(pages, dtype=np.int64)
        if pages.size == 0:
            return
        if np.unique(pages).size != pages.size or bool(self._page_free[pages].any()):
            raise RuntimeError("free_pages: a page would be freed twice (double free)")
        self._mark_free(pages)

    # ---------------------------------------------------------------- helpers
    def _lowest_free_pages(self, n: int) -> np.ndarray:
        """The ``n`` lowest free pages ([n] int64; the caller has checked that they exist).

        NOTE: scans from ``_first_free`` in growing windows, not the whole pool: a decode step takes
        a page or a few of a pool that holds millions on a GPU (2.1 M for SmolLM2 at 256 requests),
        and ``np.flatnonzero`` over all of them made every bs-1 step 3 ms slower on the H200's host.
        """
        found, start, window = [], self._first_free, max(4 * n, 4096)
        while n > 0 and start < self.num_pages:
            pages = np.flatnonzero(self._page_free[start:start + window])[:n] + start
            found.append(pages)
            n -= pages.size
            start, window = start + window, 2 * window
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _mark_free(self, pages: np.ndarray) -> None:
        self._page_free[pages] = True
        self._num_free_pages += int(pages.size)
        self._first_free = min(self._first_free, int(pages.min()))

    def _new_pages_per_req(self, prefix: np.ndarray, end: np.ndarray) -> np.ndarray:
        ps = self.page_size
        return (end + ps - 1) // ps - (prefix + ps - 1) // ps

    def _check_rows(self, rows: np.ndarray, prefix: np.ndarray, extend: np.ndarray) -> None:
        if not rows.shape == prefix.shape == extend.shape:
            raise ValueError(
                f"alloc_extend: req_pool_indices, prefix_lens, extend_lens must all be [bs], got "
                f"{tuple(rows.shape)}, {tuple(prefix.shape)}, {tuple(extend.shape)}"
            )
        if bool((prefix < 0).any()) or bool((extend < 0).any()):
            raise ValueError("alloc_extend: prefix_lens and extend_lens must be >= 0")
        if bool((rows < 0).any()) or bool((rows >= self.max_reqs).any()):
            raise ValueError(f"alloc_extend: request row out of range [0, {self.max_reqs})")
        if rows.size and bool(self._row_free[rows].any()):
            raise ValueError("alloc_extend: a request row was not taken with alloc_req")

    def _slots_for(
        self,
        rows: np.ndarray,  # [bs]
        prefix: np.ndarray,  # [bs]
        extend: np.ndarray,  # [bs]
        token_rows: np.ndarray,  # [num_tokens] row of each new position
        positions: np.ndarray,  # [num_tokens]
        new_pages: np.ndarray,  # [total_new] fresh pages, in the order they are handed out
        new_per_req: np.ndarray,  # [bs]
    ) -> np.ndarray:
        """Slots of the packed new positions ([num_tokens] int64)."""
        ps = self.page_size
        if ps == 1:  # no partial pages: the fresh pages, in order, are the slots
            return new_pages.astype(np.int64)
        bs = rows.size
        # Page of each request's partially filled last page (-1 when its prefix ends on a page
        # boundary): found through the slot of its last cached position.
        partial = (prefix % ps) != 0  # [bs]
        last_slot = self._table[rows, np.maximum(prefix - 1, 0)].astype(np.int64)
        partial_page = np.where(partial, last_slot // ps, -1)  # [bs]
        req = np.repeat(np.arange(bs), extend)  # [num_tokens]
        page_idx = positions // ps  # request-local page index of each token
        first_new = (prefix + ps - 1) // ps  # [bs] request-local index of its first fresh page
        new_offset = np.cumsum(new_per_req) - new_per_req  # [bs] into new_pages
        in_partial = page_idx < first_new[req]
        fresh_idx = np.maximum(new_offset[req] + page_idx - first_new[req], 0)
        fresh = new_pages[fresh_idx] if new_pages.size else np.zeros_like(fresh_idx)
        page = np.where(in_partial, partial_page[req], fresh)
        return page * ps + positions % ps


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a CPU tensor to ``device`` without waiting for the device's queued work.

    NOTE: a copy from pageable memory waits for the stream to drain; from pinned memory it is
    queued behind it, so the host can prepare the next step while the device still works.
    """
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _host_lens(x: Lens) -> np.ndarray:
    """[bs] int64 numpy array from a tensor (any device), an array or a sequence of ints."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.int64).flatten().numpy()
    return np.asarray(x, dtype=np.int64).reshape(-1)


def _packed_positions(start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start[b], start[b] + length[b]) over b: [sum(length)].

    Example: start = [5, 0], length = [2, 3] -> [5, 6, 0, 1, 2].
    """
    offsets = np.cumsum(length) - length  # [bs] where each run starts in the packed output
    return np.repeat(start - offsets, length) + np.arange(int(length.sum()))
