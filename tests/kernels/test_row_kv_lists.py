"""``build_row_kv_lists`` (deterministic inference's per-row KV lists): worked examples against the
reference, then Triton == reference exactly (CPU through Triton's interpreter, CUDA compiled) on
causal batches, verify trees, CUDA-graph padding requests, and input errors."""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels, kernel_devices

triton_row_kv = import_kernels("specdec.kernels.triton.row_kv")

from specdec import kernels as K  # noqa: E402

DEVICES = kernel_devices(triton_row_kv._row_kv_kernel)
POISON = -7
pytestmark = pytest.mark.usefixtures("triton_interpreter")


def tree_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: node i sees node j iff j is i or one of its ancestors (parents[root] = -1)."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    return mask


def depths(parents: list[int]) -> list[int]:
    return [int(row.sum()) - 1 for row in tree_mask(parents)]


def table(rows: int = 6, ctx: int = 40, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(rows * ctx, generator=gen).view(rows, ctx).to(torch.int32) + 100


def tree_batch(prefixes: list[int], trees: list[list[int]], seed: int = 1) -> dict:
    """A verify batch: request b (table row 2b+1) with ``prefixes[b]`` cached tokens and tree b."""
    q = len(trees[0])
    gen = torch.Generator().manual_seed(seed)
    positions = torch.tensor([p + d for p, t in zip(prefixes, trees) for d in depths(t)], dtype=torch.int64)
    return dict(
        req_to_token=table(), req_pool_indices=torch.tensor([2 * b + 1 for b in range(len(prefixes))]),
        prefix_lens=torch.tensor(prefixes), qo_indptr=torch.arange(len(prefixes) + 1) * q,
        out_cache_loc=torch.randperm(1000, generator=gen)[: q * len(prefixes)] + 5000, positions=positions,
        tree_mask=torch.cat([tree_mask(t).flatten() for t in trees]),
    )


def causal_batch(prefixes: list[int], extends: list[int]) -> dict:
    indptr = torch.tensor([0] + extends).cumsum(0)
    positions = torch.cat([p + torch.arange(e) for p, e in zip(prefixes, extends)])
    return dict(req_to_token=table(), req_pool_indices=torch.tensor([4, 0, 3][: len(prefixes)]),
                prefix_lens=torch.tensor(prefixes), qo_indptr=indptr,
                out_cache_loc=torch.arange(int(indptr[-1])) + 7000, positions=positions, tree_mask=None)


def run(op, batch: dict, lists: int, stride: int, device: str = "cpu") -> torch.Tensor:
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    out = torch.full((lists, stride), POISON, dtype=torch.int32, device=device)
    op(**args, kv_table=out)
    return out.cpu()


def test_worked_example_tree():
    """The module docstring's tree: prefix 3 at row slots r[0:3], nodes at slots 50..53."""
    batch = tree_batch([3], [[-1, 0, 0, 2]])
    batch["out_cache_loc"] = torch.tensor([50, 51, 52, 53])
    got = run(K.build_row_kv_lists_ref, batch, 4, 8)
    r = batch["req_to_token"][1, :3].tolist()
    assert got[3].tolist() == r + [50, 52, 53] + [POISON] * 2
    assert got[1].tolist() == r + [50, 51] + [POISON] * 3
    assert got[0].tolist() == r + [50] + [POISON] * 4


def test_worked_example_causal():
    batch = causal_batch([2, 0], [3, 1])
    got = run(K.build_row_kv_lists_ref, batch, 2, 6)
    r4 = batch["req_to_token"][4, :2].tolist()
    assert got[0].tolist() == r4 + [7000, 7001, 7002, POISON]
    assert got[1].tolist() == [7003] + [POISON] * 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("prefixes,trees", [
    ([3], [[-1, 0, 0, 2]]),
    ([0, 17, 5], [[-1, 0, 1, 2], [-1, 0, 0, 0], [-1, 0, 1, 0]]),  # chain, star, branch; no prefix
    ([30, 9], [[-1, 0, 0, 1, 1, 2, 5, 3], [-1, 0, 1, 2, 3, 4, 5, 6]]),
])
def test_tree_lists_match_reference(device, prefixes, trees):
    batch = tree_batch(prefixes, trees)
    lists, stride = batch["positions"].shape[0], max(prefixes) + len(trees[0]) + 3
    assert torch.equal(run(K.build_row_kv_lists, batch, lists, stride, device),
                       run(K.build_row_kv_lists_ref, batch, lists, stride))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("prefixes,extends", [([0], [1]), ([5, 0, 33], [1, 7, 2]), ([12, 3], [1, 1])])
def test_causal_lists_match_reference(device, prefixes, extends):
    batch = causal_batch(prefixes, extends)
    stride = max(p + e for p, e in zip(prefixes, extends)) + 1
    assert torch.equal(run(K.build_row_kv_lists, batch, len(prefixes), stride, device),
                       run(K.build_row_kv_lists_ref, batch, len(prefixes), stride))


@pytest.mark.parametrize("device", DEVICES)
def test_graph_padding_requests_list_their_padding_slot(device):
    """A padded CUDA-graph verify: request 1 is padding (no prefix, every node at position 0, an
    all-True mask, every slot the padding slot 99): each of its rows lists the padding slot once."""
    batch = tree_batch([4, 0], [[-1, 0, 1], [-1, 0, 1]])
    batch["positions"][3:] = 0
    batch["out_cache_loc"][3:] = 99
    batch["tree_mask"][9:] = True
    for op in (K.build_row_kv_lists, K.build_row_kv_lists_ref):
        got = run(op, batch, 6, 7, device if op is K.build_row_kv_lists else "cpu")
        assert (got[3:, 0] == 99).all() and (got[3:, 1:] == POISON).all()


@pytest.mark.parametrize("device", DEVICES)
def test_the_request_to_token_rows_lengths_and_stride_are_checked(device):
    batch = tree_batch([6], [[-1, 0, 1]])
    for op in (K.build_row_kv_lists, K.build_row_kv_lists_ref):
        with pytest.raises(ValueError, match="stride"):
            run(op, batch, 3, 8)  # the deepest row lists 9 entries
    bad = dict(batch, req_pool_indices=torch.tensor([9]))
    for op in (K.build_row_kv_lists, K.build_row_kv_lists_ref):
        with pytest.raises(ValueError, match="req_to_token|row"):
            run(op, bad, 3, 12)
    with pytest.raises(ValueError, match="kv_table: expected 3 lists"):
        run(K.build_row_kv_lists, batch, 1, 12)
