"""``commit_step``: everything a verified step derives from its accepted paths, in one launch.

After the verify walk, the EAGLE worker needs per request: the slots to compact the accepted
nodes' target K/V (``compact_accepted_kv_locs``), the committed tokens and the next root, the
lengths after the step, the row the host reads back, and the inputs of the draft extend over the
committed tokens (positions, KV slots, the verify rows whose features it reads). As torch ops
these were ~25 small launches between two CUDA graphs; here they are one (issue #40).

Glossary: bs = requests; N = num_draft_tokens; W = num_steps + 1 = accept_index.shape[1];
k = accept_length (accepted draft tokens; k + 1 committed); a request's *row* is its row of
``req_to_token``. Padding entries (i > k) follow the worker's conventions: node 0 (its row of
``predicts`` and of the verify's features), token ``predicts[0]``, the draft's ``pad_slot``.

Worked example, N = 4, W = 3, one request in row 0 with seq_len 10, row[10:14] = [50, 51, 52, 53],
accept_index [0, 2, -1] (k = 1), predicts [a, x, b, y] (the target's token after each node)::

    src_locs [50, 52, 50]   dst_locs [50, 51, 50]   (compact_accepted_kv_locs' moves)
    nodes    [0, 2, 0]      tokens   [a, b, a]      next_tokens [b]   next_seq_lens [12]
    host     [0, 10, 1, a, b, a]                    (row, seq_len, k, tokens)
    shifted draft (park_base -1):  positions [10, 11, 12]   slots [50, 51, pad]
    aligned draft (park_base 90):  positions [11, 12, 13]   slots [51, park 90 + row 0, pad]
    num_committed [2]

With ``observe`` the host row goes on with the accepted path as local node indices ([0, 2, -1])
and the tree's ``retrive_next_token`` and ``retrive_next_sibling`` rows (adaptive speculation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.kernels.common import INDEX_DTYPES, check_rows, check_tensor, table_row
from specdec.kernels.dispatch import select_impl


class CommitOutputs(NamedTuple):
    """``commit_step``'s outputs, all int64 and written in full."""

    src_locs: torch.Tensor  # [bs, W] accepted node i's K/V slot now
    dst_locs: torch.Tensor  # [bs, W] its slot once committed
    nodes: torch.Tensor  # [bs, W] global verify row of accepted node i (0 past k)
    tokens: torch.Tensor  # [bs, W] committed tokens (predicts[nodes]); the draft extend's input ids
    next_tokens: torch.Tensor  # [bs] tokens[k]: the next root
    next_seq_lens: torch.Tensor  # [bs] seq_len + k + 1
    positions: torch.Tensor  # [bs, W] the draft extend's positions
    slots: torch.Tensor  # [bs, W] the draft extend's KV slots
    num_committed: torch.Tensor  # [bs] k + 1
    host: torch.Tensor  # [bs, 3 + W] (row, seq_len, k, tokens), or [bs, 3 + 2W + 2N] with observe


def host_width(num_steps: int, num_draft_tokens: int, *, observe: bool) -> int:
    w = num_steps + 1
    return 3 + 2 * w + 2 * num_draft_tokens if observe else 3 + w


def commit_step(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] tokens in KV before the verify
    accept_index: torch.Tensor,  # [bs, W] global node b*N + t, root first; -1 past k
    accept_length: torch.Tensor,  # [bs] k
    predicts: torch.Tensor,  # [bs * N] the target's token after each node
    retrive_next_token: torch.Tensor,  # [bs, N] int64 (read with observe only)
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64 (read with observe only)
    out: CommitOutputs,
    *,
    num_draft_tokens: int,
    pad_slot: int,
    park_base: int,
) -> None:
    """Write ``out`` (see the module docstring); ``park_base`` -1 for a shifted (EAGLE) draft,
    else an aligned (standalone) draft's first parking slot. Observe when ``out.host`` is wide."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens, "accept_length": accept_length})
    n = int(num_draft_tokens)
    check_tensor("accept_index", accept_index, dtype=INDEX_DTYPES, dim=2, device=device)
    if accept_index.shape[0] != bs or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index: expected shape ({bs}, W >= 1), got {tuple(accept_index.shape)}")
    w = accept_index.shape[1]
    check_tensor("predicts", predicts, dtype=INDEX_DTYPES, shape=(bs * n,), device=device)
    for name in ("retrive_next_token", "retrive_next_sibling"):
        check_tensor(name, locals()[name], dtype=torch.int64, shape=(bs, n), device=device)
    for name, t in out._asdict().items():
        shape = {"next_tokens": (bs,), "next_seq_lens": (bs,), "num_committed": (bs,)}.get(name, (bs, w))
        if name == "host":
            widths = (host_width(w - 1, n, observe=False), host_width(w - 1, n, observe=True))
            shape = (bs, t.shape[1] if t.dim() == 2 and t.shape[1] in widths else widths[0])
        check_tensor(name, t, dtype=torch.int64, shape=shape, device=device)
    impl = select_impl("commit_step", commit_step_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, predicts, retrive_next_token,
         retrive_next_sibling, out, num_draft_tokens=n, pad_slot=int(pad_slot), park_base=int(park_base))


def commit_step_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_length: torch.Tensor,
    predicts: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    out: CommitOutputs,
    *,
    num_draft_tokens: int,
    pad_slot: int,
    park_base: int,
) -> None:
    """Specification of ``commit_step`` (the module docstring's example)."""
    n, w = num_draft_tokens, accept_index.shape[1]
    observe = out.host.shape[1] > 3 + w
    shift = 0 if park_base < 0 else 1  # an aligned draft's committed tokens sit one position later
    pred = predicts.tolist()
    for b, (row, base, k) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), accept_length.tolist())):
        table = table_row(req_to_token, row, b).tolist()
        if not 0 <= base <= base + n <= len(table):
            raise ValueError(f"seq_lens: request {b} has seq_len {base}; seq_len + N must be within [0, {len(table)}]")
        if not 0 <= k < w:
            raise ValueError(f"accept_length: request {b} has {k} accepted, expected [0, {w})")
        accepted = accept_index[b].tolist()
        nodes = [accepted[i] if i <= k else 0 for i in range(w)]
        if any(not b * n <= nodes[i] < (b + 1) * n for i in range(k + 1)):
            raise ValueError(f"accept_index: request {b} has an entry that is not one of its nodes")
        tokens = [pred[t] for t in nodes]
        src = [table[base + nodes[i] - b * n] if i <= k else table[base] for i in range(w)]
        dst = [table[base + i] if i <= k else table[base] for i in range(w)]
        if shift:  # accepted ones after the root, the bonus parked
            slots = [table[base + 1 + i] if i < k else park_base + row if i == k else pad_slot for i in range(w)]
        else:
            slots = [dst[i] if i <= k else pad_slot for i in range(w)]
        for name, values in (("src_locs", src), ("dst_locs", dst), ("nodes", nodes), ("tokens", tokens),
                             ("positions", [base + shift + i for i in range(w)]), ("slots", slots)):
            getattr(out, name)[b] = torch.tensor(values)
        out.next_tokens[b], out.next_seq_lens[b], out.num_committed[b] = tokens[k], base + k + 1, k + 1
        host = [row, base, k] + tokens
        if observe:
            host += [nodes[i] - b * n if i <= k else -1 for i in range(w)]
            host += retrive_next_token[b].tolist() + retrive_next_sibling[b].tolist()
        out.host[b] = torch.tensor(host)
