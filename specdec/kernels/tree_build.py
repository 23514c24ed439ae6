"""Draft-tree construction ops: ``build_tree_kernel_efficient`` and ``reconstruct_indices_from_tree_mask``.

Both match sgl_kernel's ops of the same name (signature, dtypes, in-place writes). Each public op
checks its inputs and dispatches; ``*_ref`` is the specification (host loops, any device).

Glossary: bs = requests; N = draft_token_num = tree nodes per request, node 0 is the root (the
last verified token); K = topk; depth = num_steps of drafting. A *score index* names one
candidate of the draft expansion, flattened over steps: step 0 owns score indices ``[0, K)``,
step ``i >= 1`` owns ``[K + (i-1)K^2, K + iK^2)`` (K frontier branches x K children each).

``selected_index[b]`` ([N-1], ascending) holds the score indices of the N-1 kept nodes; node
``t >= 1`` is ``selected_index[b, t-1]``. ``parent_list[b]`` ([K*(depth-1)+1]) maps
``score_index // K`` to the score index of that candidate's parent: entry 0 is -1 (the root),
entry ``1 + (i-1)K + r`` is the score index of frontier branch r after step i-1.

Retrieve arrays (per request, local node indices, -1 = none):
  ``retrive_index[b, t] = b*N + t``; ``retrive_next_token[b, p]`` = smallest-index child of p;
  ``retrive_next_sibling[b, c]`` = next larger-index child of c's parent.
"""

from __future__ import annotations

import torch

from specdec.kernels.common import MASK_MODES, TreeMaskMode, check_tensor, matches, packed_mask_bytes
from specdec.kernels.dispatch import select_impl


def _check_tree_indices(
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    *,
    bs: int,
    n: int,
    device: torch.device,
) -> None:
    """The per-request index tensors both tree ops read or write: [bs], [bs*N] and [bs, N] int64."""
    i64 = torch.int64
    if (matches(verified_seq_len, i64, (bs,), device) and matches(positions, i64, (bs * n,), device)
            and matches(retrive_index, i64, (bs, n), device) and matches(retrive_next_token, i64, (bs, n), device)
            and matches(retrive_next_sibling, i64, (bs, n), device)):
        return
    check_tensor("verified_seq_len", verified_seq_len, dtype=torch.int64, shape=(bs,), device=device)
    check_tensor("positions", positions, dtype=torch.int64, shape=(bs * n,), device=device)
    for name, t in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        check_tensor(name, t, dtype=torch.int64, shape=(bs, n), device=device)


def _check_draft(
    parent_list: torch.Tensor, selected_index: torch.Tensor, *, topk: int, depth: int, n: int
) -> tuple[int, torch.device]:
    """parent_list [bs, topk*(depth-1)+1] (or [bs, 0] when depth == 1) and selected_index [bs, N-1],
    int64; returns (bs, device)."""
    width = topk * (depth - 1) + 1
    if isinstance(parent_list, torch.Tensor) and parent_list.dim() == 2:
        (bs, cols), device = parent_list.shape, parent_list.device
        if ((cols == width or depth == 1 and cols == 0) and matches(parent_list, torch.int64, None, device)
                and matches(selected_index, torch.int64, (bs, n - 1), device)):
            return bs, device
    check_tensor("parent_list", parent_list, dtype=torch.int64, dim=2)
    device, bs = parent_list.device, parent_list.shape[0]
    if parent_list.shape[1] != width and not (depth == 1 and parent_list.shape[1] == 0):
        raise ValueError(f"parent_list: expected {width} columns (topk*(depth-1)+1), got {parent_list.shape[1]}")
    check_tensor("selected_index", selected_index, dtype=torch.int64, shape=(bs, n - 1), device=device)
    return bs, device


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,  # [bs, topk * (depth - 1) + 1] int64 (or [bs, 0] when depth == 1)
    selected_index: torch.Tensor,  # [bs, N - 1] int64
    verified_seq_len: torch.Tensor,  # [bs] int64
    tree_mask: torch.Tensor,  # bool (modes 0, 1) or packed uint8/16/32 (mode 2), flat
    positions: torch.Tensor,  # [bs * N] int64
    retrive_index: torch.Tensor,  # [bs, N] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build each request's tree mask, positions and retrieve arrays in place (see the ref)."""
    n = int(draft_token_num)
    if topk < 1 or depth < 1 or n < 1:
        raise ValueError(f"topk, depth, draft_token_num must be >= 1, got {topk}, {depth}, {n}")
    mode = MASK_MODES.get(tree_mask_mode)  # TreeMaskMode(int(...)) costs 0.5 µs a call
    if mode is None:
        try:
            mode = TreeMaskMode(int(tree_mask_mode))
        except ValueError:
            raise ValueError(f"tree_mask_mode: unknown mode {tree_mask_mode}") from None
    bs, device = _check_draft(parent_list, selected_index, topk=topk, depth=depth, n=n)
    _check_tree_indices(verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling,
                        bs=bs, n=n, device=device)
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        check_tensor("tree_mask", tree_mask, dtype=(torch.uint8, torch.uint16, torch.uint32), dim=1, device=device)
        need, have = bs * n * packed_mask_bytes(n), tree_mask.numel() * tree_mask.element_size()
    else:
        check_tensor("tree_mask", tree_mask, dtype=torch.bool, dim=1, device=device)
        # FULL_MASK also needs sum(verified_seq_len) * N more entries; the ref checks that value.
        need, have = bs * n * n, tree_mask.numel()
    if have < need:
        raise ValueError(f"tree_mask: {have} bytes/entries is too small, need at least {need}")
    impl = select_impl("build_tree_kernel_efficient", build_tree_kernel_efficient_ref, device)
    impl(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
        retrive_next_token, retrive_next_sibling, topk, depth, n, int(mode),
    )


def build_tree_kernel_efficient_ref(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Specification of ``build_tree_kernel_efficient``.

    Worked example, K = 2, depth = 2, N = 4, one request with seq_len 5::

        score indices: step 0 -> 0, 1; step 1 -> 2..5 (2,3 extend branch 0; 4,5 extend branch 1)
        parent_list   = [-1, 0, 1]          (index s // K -> parent score index)
        selected_index = [0, 1, 3]          node 1 = s0, node 2 = s1, node 3 = s3 (3 // 2 = 1 -> s0)

              root(0)              mask (QLEN_ONLY)     positions  next_token  next_sibling
             /      \\              1 0 0 0              5          1           -1
          n1(s0)   n2(s1)          1 1 0 0              6          3            2
            |                      1 0 1 0              6          -1          -1
          n3(s3)                   1 1 0 1              7          -1          -1

    Writes: positions, retrive_index, retrive_next_token and retrive_next_sibling entirely
    (sgl_kernel only writes the -1-free entries and relies on the caller's -1 fill; the results
    agree on that fill). FULL_MASK: only the N tree columns of each row; the seq_len prefix
    columns stay as the caller filled them (SGLang fills True). QLEN_ONLY: every N x N entry.
    BITPACKING: every byte of each row (row t of request b at bytes ``(b*N + t) * nbytes``,
    little-endian: bit j = column j; sgl_kernel ORs bits into a zero-filled buffer).

    NOTE: sgl_kernel prints a warning and skips a node whose parent was not selected (a NaN
    logprob symptom); here any malformed tree raises ``ValueError("invalid draft tree: ...")``.
    """
    n, mode = draft_token_num, TreeMaskMode(tree_mask_mode)
    parents_rows = parent_list.tolist()
    selected_rows = selected_index.tolist()
    seq_lens = verified_seq_len.tolist()
    if mode == TreeMaskMode.FULL_MASK and tree_mask.numel() < (sum(seq_lens) + len(seq_lens) * n) * n:
        raise ValueError(f"tree_mask: FULL_MASK needs (sum(seq_lens) + bs*N) * N = "
                         f"{(sum(seq_lens) + len(seq_lens) * n) * n} entries, got {tree_mask.numel()}")
    mask_bytes = tree_mask.view(torch.uint8) if mode == TreeMaskMode.QLEN_ONLY_BITPACKING else None
    row_start = 0  # FULL_MASK: offset of request b's first mask row
    for b, seq_len in enumerate(seq_lens):
        parent = _parents_of_nodes(selected_rows[b], parents_rows[b], topk, n)
        ancestors = _ancestor_sets(parent)
        first_child, next_sibling = _first_child_next_sibling(parent)
        block = torch.zeros(n, n, dtype=torch.bool)  # [N, N] row t = what node t attends to
        for t in range(n):
            block[t, list(ancestors[t])] = True
        depth_of = [len(a) - 1 for a in ancestors]
        positions[b * n : (b + 1) * n] = torch.tensor([seq_len + d for d in depth_of])
        retrive_index[b] = torch.arange(b * n, (b + 1) * n)
        retrive_next_token[b] = torch.tensor(first_child)
        retrive_next_sibling[b] = torch.tensor(next_sibling)
        if mode == TreeMaskMode.FULL_MASK:
            rows = tree_mask[row_start : row_start + n * (seq_len + n)].view(n, seq_len + n)
            rows[:, seq_len:] = block.to(tree_mask.device)
            row_start += n * (seq_len + n)
        elif mode == TreeMaskMode.QLEN_ONLY:
            tree_mask[b * n * n : (b + 1) * n * n] = block.flatten().to(tree_mask.device)
        else:
            nbytes = packed_mask_bytes(n)
            rows = mask_bytes[b * n * nbytes : (b + 1) * n * nbytes].view(n, nbytes)
            rows.copy_(_pack_rows_little(block, nbytes))


def _parents_of_nodes(selected: list[int], parents: list[int], topk: int, n: int) -> list[int]:
    """Local parent node of every node (root: -1), from score indices."""
    node_of_score: dict[int, int] = {}
    for t, s in enumerate(selected, start=1):
        node_of_score.setdefault(s, t)
    parent = [-1] * n
    for t, s in enumerate(selected, start=1):
        if s < 0:
            raise ValueError(f"invalid draft tree: node {t} has negative score index {s}")
        row = s // topk
        if row == 0:  # a step-0 candidate: child of the root
            parent[t] = 0
            continue
        if row >= len(parents):
            raise ValueError(f"invalid draft tree: node {t} (score index {s}) points past parent_list "
                             f"(entry {row}, length {len(parents)})")
        if parents[row] not in node_of_score:
            raise ValueError(f"invalid draft tree: the parent (score index {parents[row]}) of node {t} "
                             f"is not among the selected nodes")
        parent[t] = node_of_score[parents[row]]
    return parent


def _ancestor_sets(parent: list[int]) -> list[set[int]]:
    """Nodes each node attends to: itself, its ancestors and the root. Walks bounded by N."""
    n = len(parent)
    result = []
    for t in range(n):
        seen, cur = {0, t}, t
        for _ in range(n):
            cur = parent[cur]
            if cur <= 0:
                break
            seen.add(cur)
        else:
            raise ValueError(f"invalid draft tree: node {t} has a cycle among its ancestors")
        result.append(seen)
    return result


def _first_child_next_sibling(parent: list[int]) -> tuple[list[int], list[int]]:
    """First-child / next-sibling links: children of a node chained in ascending index order."""
    n = len(parent)
    first_child, next_sibling = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for c in range(1, n):
        p = parent[c]
        if p in last_child:
            next_sibling[last_child[p]] = c
        else:
            first_child[p] = c
        last_child[p] = c
    return first_child, next_sibling


def _pack_rows_little(block: torch.Tensor, nbytes: int) -> torch.Tensor:
    """[N, N] bool -> [N, nbytes] uint8, bit j of a row at byte j // 8, bit j % 8."""
    n = block.shape[0]
    bits = torch.zeros(n, nbytes * 8, dtype=torch.int64)
    bits[:, :n] = block.to(torch.int64)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int64)
    return (bits.view(n, nbytes, 8) * weights).sum(-1).to(torch.uint8)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # [bs * N * N] bool, QLEN_ONLY layout
    verified_seq_len: torch.Tensor,  # [bs] int64
    positions: torch.Tensor,  # [bs * N] int64
    retrive_index: torch.Tensor,  # [bs, N] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Recover positions and retrieve arrays from a QLEN_ONLY tree mask, in place (see the ref)."""
    bs, n = int(batch_size), int(draft_token_num)
    if bs < 0 or n < 1:
        raise ValueError(f"batch_size must be >= 0 and draft_token_num >= 1, got {bs}, {n}")
    check_tensor("tree_mask", tree_mask, dtype=torch.bool, dim=1)
    device = tree_mask.device
    if tree_mask.numel() < bs * n * n:
        raise ValueError(f"tree_mask: expected at least bs*N*N = {bs * n * n} entries, got {tree_mask.numel()}")
    _check_tree_indices(verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling,
                        bs=bs, n=n, device=device)
    impl = select_impl("reconstruct_indices_from_tree_mask", reconstruct_indices_from_tree_mask_ref, device)
    impl(tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling, bs, n)


def reconstruct_indices_from_tree_mask_ref(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Specification of ``reconstruct_indices_from_tree_mask``; writes every output entry.

    Nodes must be in topological order (ancestors before descendants), as build_tree emits::

              0            mask        parent  depth  next_token  next_sibling
             / \\           1 0 0 0     -1      0      1           -1
            1   2          1 1 0 0      0      1      3            2
            |              1 0 1 0      0      1      -1          -1
            3              1 1 0 1      1      2      -1          -1

    For node t (the diagonal is ignored):
      depth = number of True entries left of the diagonal; positions = seq_len + depth;
      parent = the largest column < t that is True (-1 if none);
      next_token = the smallest row i > t whose column t is True (smallest-index descendant);
      next_sibling = the smallest row i > t with the same parent (sgl_kernel phrases this as
        "column parent(t) True and nothing True strictly between it and the diagonal");
      retrive_index = b*N + t.
    No walks, so a mask that is not a tree cannot loop; it just yields meaningless links.
    """
    n = draft_token_num
    masks = tree_mask[: batch_size * n * n].view(batch_size, n, n).cpu()  # [bs, N, N]
    seq_lens = verified_seq_len.tolist()
    for b in range(batch_size):
        m = masks[b].tolist()
        parent = [max((j for j in range(t) if m[t][j]), default=-1) for t in range(n)]
        depth = [sum(m[t][:t]) for t in range(n)]
        next_token = [next((i for i in range(t + 1, n) if m[i][t]), -1) for t in range(n)]
        next_sibling = [
            next((i for i in range(t + 1, n) if parent[i] == parent[t]), -1) if parent[t] != -1 else -1
            for t in range(n)
        ]
        positions[b * n : (b + 1) * n] = torch.tensor([seq_lens[b] + d for d in depth])
        retrive_index[b] = torch.arange(b * n, (b + 1) * n)
        retrive_next_token[b] = torch.tensor(next_token)
        retrive_next_sibling[b] = torch.tensor(next_sibling)
