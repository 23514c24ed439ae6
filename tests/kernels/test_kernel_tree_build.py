"""build_tree_kernel_efficient and reconstruct_indices_from_tree_mask: worked tables, every output
checked exactly, in all three mask modes; input validation; malformed trees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.kernels import (
    TreeMaskMode,
    build_tree_kernel_efficient,
    reconstruct_indices_from_tree_mask,
)

POISON = -7


def run_build(parent_list, selected_index, seq_lens, topk, depth, n, mode, *, mask_fill=None):
    """Run the op on poisoned outputs; returns (tree_mask, positions, index, next_token, next_sibling)."""
    parent_list = torch.tensor(parent_list, dtype=torch.int64)
    selected_index = torch.tensor(selected_index, dtype=torch.int64).reshape(len(seq_lens), n - 1)
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    bs = len(seq_lens)
    if mode == TreeMaskMode.FULL_MASK:
        tree_mask = mask_fill.clone()
    elif mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.rand(bs * n * n) < 0.5  # every entry is written
    else:
        nbytes = 1 if n <= 8 else 2 if n <= 16 else 4
        tree_mask = torch.full((bs * n * nbytes,), 0xAB, dtype=torch.uint8)  # every byte is written
    positions = torch.full((bs * n,), POISON, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, bs, n), POISON, dtype=torch.int64)
    build_tree_kernel_efficient(
        parent_list, selected_index, seq, tree_mask, positions, index, next_token, next_sibling,
        topk, depth, n, mode,
    )
    return tree_mask, positions, index, next_token, next_sibling


def pack_little(block: np.ndarray, nbytes: int) -> np.ndarray:
    """[rows, N] bool -> [rows * nbytes] uint8 with numpy's little bit order, rows padded to nbytes."""
    packed = np.packbits(block.astype(np.uint8), axis=1, bitorder="little")
    out = np.zeros((block.shape[0], nbytes), dtype=np.uint8)
    out[:, : packed.shape[1]] = packed
    return out.flatten()


# Each case: (parent_list, selected_index, seq_lens, topk, depth, N, QLEN blocks, positions,
#             next_token, next_sibling); retrive_index is always b*N + t.
CHAIN = dict(
    # topk 1, depth 3: score index i is step i's only proposal; its parent is i - 1.
    #     root(0) -> 1 -> 2 -> 3
    parent_list=[[-1, 0, 1]],
    selected_index=[0, 1, 2],
    seq_lens=[5],
    topk=1,
    depth=3,
    n=4,
    blocks=[[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]],
    positions=[5, 6, 7, 8],
    next_token=[[1, 2, 3, -1]],
    next_sibling=[[-1, -1, -1, -1]],
)
TREE = dict(
    # topk 2, depth 3. Score indices: step 0 -> 0, 1 (a, b); step 1 -> 2..5 (2, 3 extend a;
    # 4, 5 extend b); frontier after step 1 = score indices [2, 4]; step 2 -> 6..9 (6, 7 extend
    # score index 2). parent_list = [-1, 0, 1, 2, 4]. Selected [0, 1, 2, 3, 6]:
    #            root(0)
    #           /       \
    #        1 (s0)    2 (s1)
    #        /    \
    #     3 (s2)  4 (s3)        s2, s3: 2 // 2 = 3 // 2 = 1 -> parent_list[1] = 0 -> node 1
    #       |
    #     5 (s6)                s6: 6 // 2 = 3 -> parent_list[3] = 2 -> node 3
    parent_list=[[-1, 0, 1, 2, 4]],
    selected_index=[0, 1, 2, 3, 6],
    seq_lens=[9],
    topk=2,
    depth=3,
    n=6,
    blocks=[[
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ]],
    positions=[9, 10, 10, 11, 11, 12],
    next_token=[[1, 3, -1, 5, -1, -1]],
    next_sibling=[[-1, 2, -1, 4, -1, -1]],
)
BATCH = dict(
    # bs 2, topk 2, depth 2, seq_lens [3, 1], parent_list [-1, 0, 1] for both.
    # request 0, selected [0, 1, 3]:     request 1, selected [0, 2, 3]:
    #        0                                  0
    #       / \                                 |
    #      1   2                                1
    #      |                                   / \
    #      3                                  2   3
    parent_list=[[-1, 0, 1], [-1, 0, 1]],
    selected_index=[0, 1, 3, 0, 2, 3],
    seq_lens=[3, 1],
    topk=2,
    depth=2,
    n=4,
    blocks=[
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]],
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]],
    ],
    positions=[3, 4, 4, 5, 1, 2, 3, 3],
    next_token=[[1, 3, -1, -1], [1, 2, -1, -1]],
    next_sibling=[[-1, 2, -1, -1], [-1, -1, 3, -1]],
)
CASES = {"chain": CHAIN, "tree": TREE, "batch": BATCH}


def expected_full_mask(case, fill: torch.Tensor) -> torch.Tensor:
    out, start, n = fill.clone(), 0, case["n"]
    for seq_len, block in zip(case["seq_lens"], case["blocks"]):
        rows = out[start : start + n * (seq_len + n)].view(n, seq_len + n)
        rows[:, seq_len:] = torch.tensor(block, dtype=torch.bool)
        start += n * (seq_len + n)
    return out


@pytest.mark.parametrize("mode", list(TreeMaskMode))
@pytest.mark.parametrize("name", CASES)
def test_build_tree_tables(name, mode):
    case = CASES[name]
    n, bs = case["n"], len(case["seq_lens"])
    # FULL_MASK: the prefix columns keep whatever the caller put there (random here).
    fill = torch.rand(sum(case["seq_lens"]) * n + bs * n * n) < 0.5
    mask, positions, index, next_token, next_sibling = run_build(
        case["parent_list"], case["selected_index"], case["seq_lens"], case["topk"], case["depth"], n, mode,
        mask_fill=fill,
    )
    blocks = np.array(case["blocks"], dtype=bool).reshape(bs * n, n)
    if mode == TreeMaskMode.FULL_MASK:
        assert torch.equal(mask, expected_full_mask(case, fill))
    elif mode == TreeMaskMode.QLEN_ONLY:
        assert torch.equal(mask, torch.from_numpy(blocks.flatten()))
    else:
        assert torch.equal(mask, torch.from_numpy(pack_little(blocks, 1)))
    assert torch.equal(positions, torch.tensor(case["positions"]))
    assert torch.equal(index, torch.arange(bs * n).view(bs, n))
    assert torch.equal(next_token, torch.tensor(case["next_token"]))
    assert torch.equal(next_sibling, torch.tensor(case["next_sibling"]))


def test_packed_rows_of_the_tree_table():
    """Little-endian: bit j of row t means node t sees node j (row 5 = 0b101011 = 43)."""
    mask, *_ = run_build(TREE["parent_list"], TREE["selected_index"], [9], 2, 3, 6,
                         TreeMaskMode.QLEN_ONLY_BITPACKING)
    assert mask.tolist() == [1, 3, 5, 11, 19, 43]


@pytest.mark.parametrize("n, nbytes", [(9, 2), (16, 2), (17, 4), (32, 4)])
def test_bitpacking_width_follows_sgl_kernel(n, nbytes):
    """A topk-1 chain of N nodes: row t sees nodes 0..t; rows are 1, 2 or 4 bytes wide."""
    parent_list = [[-1] + list(range(n - 2))]
    mask, positions, *_ = run_build(parent_list, list(range(n - 1)), [2], 1, n - 1, n,
                                    TreeMaskMode.QLEN_ONLY_BITPACKING)
    chain = np.tril(np.ones((n, n), dtype=bool))
    assert mask.numel() == n * nbytes
    assert torch.equal(mask, torch.from_numpy(pack_little(chain, nbytes)))
    assert torch.equal(positions, torch.arange(2, 2 + n))


def test_bitpacking_accepts_sglang_wide_dtypes():
    """SGLang allocates [bs*N] uint16 for 8 < N <= 16; the bytes are the little-endian rows."""
    n = 12
    parent_list = [[-1] + list(range(n - 2))]
    mask = torch.full((n,), 0x5A5A, dtype=torch.uint16)
    pos = torch.empty(n, dtype=torch.int64)
    idx, nt, ns = torch.full((3, 1, n), -1, dtype=torch.int64)
    build_tree_kernel_efficient(torch.tensor(parent_list), torch.arange(n - 1)[None], torch.tensor([0]),
                                mask, pos, idx, nt, ns, 1, n - 1, n, 2)
    assert mask.to(torch.int64).tolist() == [(1 << (t + 1)) - 1 for t in range(n)]


@pytest.mark.parametrize("name", CASES)
def test_reconstruct_tables(name):
    case = CASES[name]
    n, bs = case["n"], len(case["seq_lens"])
    mask = torch.tensor(case["blocks"], dtype=torch.bool).flatten()
    positions = torch.full((bs * n,), POISON, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, bs, n), POISON, dtype=torch.int64)
    reconstruct_indices_from_tree_mask(mask, torch.tensor(case["seq_lens"]), positions, index, next_token,
                                       next_sibling, bs, n)
    assert torch.equal(positions, torch.tensor(case["positions"]))
    assert torch.equal(index, torch.arange(bs * n).view(bs, n))
    assert torch.equal(next_token, torch.tensor(case["next_token"]))
    assert torch.equal(next_sibling, torch.tensor(case["next_sibling"]))


# --------------------------------------------------------------------------- malformed trees
@pytest.mark.parametrize(
    "parent_list, selected, n, message",
    [
        # node 1 = s6 -> parent_list[3] = 8 = node 2; node 2 = s8 -> parent_list[4] = 6 = node 1
        ([[-1, 0, 1, 8, 6]], [6, 8], 3, "cycle"),
        # node 1 = s6 -> parent_list[3] = 6 = itself
        ([[-1, 0, 1, 6, 4]], [6], 2, "cycle"),
        # node 1 = s6 -> parent_list[3] = 2, which was not selected
        ([[-1, 0, 1, 2, 4]], [6], 2, "not among the selected"),
        # score index 40 // 2 = 20 is past parent_list (5 entries)
        ([[-1, 0, 1, 2, 4]], [40], 2, "past parent_list"),
        ([[-1, 0, 1, 2, 4]], [-3], 2, "negative"),
    ],
)
@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_malformed_tree_raises(parent_list, selected, n, message, mode):
    with pytest.raises(ValueError, match=f"invalid draft tree: .*{message}"):
        run_build(parent_list, selected, [4], 2, 3, n, mode, mask_fill=torch.ones(4 * n + n * n, dtype=torch.bool))


# --------------------------------------------------------------------------- validation
def _valid_args(n=4, bs=1):
    return dict(
        parent_list=torch.tensor([[-1, 0, 1]] * bs),
        selected_index=torch.tensor([[0, 1, 3]] * bs),
        verified_seq_len=torch.full((bs,), 3),
        tree_mask=torch.ones(bs * n * n, dtype=torch.bool),
        positions=torch.empty(bs * n, dtype=torch.int64),
        retrive_index=torch.empty(bs, n, dtype=torch.int64),
        retrive_next_token=torch.full((bs, n), -1),
        retrive_next_sibling=torch.full((bs, n), -1),
        topk=2, depth=2, draft_token_num=n, tree_mask_mode=TreeMaskMode.QLEN_ONLY,
    )


@pytest.mark.parametrize(
    "override, name",
    [
        (dict(parent_list=torch.tensor([[-1, 0, 1]], dtype=torch.int32)), "parent_list"),
        (dict(parent_list=torch.tensor([[-1, 0, 1, 2]])), "parent_list"),
        (dict(selected_index=torch.tensor([[0, 1]])), "selected_index"),
        (dict(selected_index=torch.tensor([[0, 0, 1, 1, 3, 3]])[:, ::2]), "selected_index"),
        (dict(verified_seq_len=torch.tensor([3], dtype=torch.int32)), "verified_seq_len"),
        (dict(positions=torch.empty(3, dtype=torch.int64)), "positions"),
        (dict(retrive_index=torch.empty(1, 4, dtype=torch.int32)), "retrive_index"),
        (dict(retrive_next_sibling=torch.empty(4, 1, dtype=torch.int64)), "retrive_next_sibling"),
        (dict(tree_mask=torch.ones(16, dtype=torch.uint8)), "tree_mask"),
        (dict(tree_mask=torch.ones(15, dtype=torch.bool)), "tree_mask"),
        (dict(tree_mask_mode=7), "tree_mask_mode"),
    ],
)
def test_build_tree_validation(override, name):
    args = {**_valid_args(), **override}
    with pytest.raises(ValueError, match=name):
        build_tree_kernel_efficient(**args)


def test_full_mask_too_small_for_prefix_raises():
    args = {**_valid_args(), "tree_mask_mode": TreeMaskMode.FULL_MASK}  # needs 3*4 + 16 entries
    with pytest.raises(ValueError, match="tree_mask"):
        build_tree_kernel_efficient(**args)


def test_bitpacking_more_than_32_nodes_raises():
    n = 33
    args = {**_valid_args(n), "parent_list": torch.tensor([[-1] + list(range(n - 2))]),
            "selected_index": torch.arange(n - 1)[None], "topk": 1, "depth": n - 1,
            "tree_mask": torch.zeros(n * 8, dtype=torch.uint8),
            "tree_mask_mode": TreeMaskMode.QLEN_ONLY_BITPACKING}
    with pytest.raises(ValueError, match="draft_token_num <= 32"):
        build_tree_kernel_efficient(**args)


def test_reconstruct_validation():
    n = 4
    ok = dict(tree_mask=torch.ones(n * n, dtype=torch.bool), verified_seq_len=torch.tensor([2]),
              positions=torch.empty(n, dtype=torch.int64), retrive_index=torch.empty(1, n, dtype=torch.int64),
              retrive_next_token=torch.empty(1, n, dtype=torch.int64),
              retrive_next_sibling=torch.empty(1, n, dtype=torch.int64), batch_size=1, draft_token_num=n)
    for key, bad in [("tree_mask", torch.ones(n * n, dtype=torch.uint8)), ("tree_mask", torch.ones(5, dtype=torch.bool)),
                     ("verified_seq_len", torch.tensor([2.0])), ("positions", torch.empty(n, dtype=torch.int32)),
                     ("retrive_next_token", torch.empty(1, n + 1, dtype=torch.int64))]:
        with pytest.raises(ValueError, match=key):
            reconstruct_indices_from_tree_mask(**{**ok, key: bad})


@pytest.mark.parametrize(
    "key, bad",
    [
        ("verified_seq_len", [3]),  # not a tensor
        ("positions", torch.empty(8, dtype=torch.int64)[::2]),  # not contiguous
        ("retrive_index", torch.empty(4, dtype=torch.int64)),  # [N], not [bs, N]
        ("retrive_next_token", torch.full((1, 4), -1, device="meta")),  # another device
        ("retrive_next_sibling", torch.full((1, 4), -1, dtype=torch.int32)),
    ],
)
def test_index_checks_name_the_argument(key, bad):
    """Valid index tensors take the one-pass check; each kind of mismatch it rejects goes through the
    named checks, in both tree ops."""
    build_args = _valid_args()
    shared = ["tree_mask", "verified_seq_len", "positions", "retrive_index", "retrive_next_token",
              "retrive_next_sibling"]
    rebuild_args = {**{k: build_args[k] for k in shared}, "batch_size": 1, "draft_token_num": 4}
    build_tree_kernel_efficient(**build_args)
    reconstruct_indices_from_tree_mask(**rebuild_args)
    with pytest.raises(ValueError, match=f"^{key}:"):
        build_tree_kernel_efficient(**{**build_args, key: bad})
    with pytest.raises(ValueError, match=f"^{key}:"):
        reconstruct_indices_from_tree_mask(**{**rebuild_args, key: bad})
