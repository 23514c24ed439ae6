"""commit_step: the worked example against the reference, the reference against the torch chain it
replaces in the worker, then Triton == reference exactly on random inputs (CPU through Triton's
interpreter, CUDA compiled), and bad input raising in both."""

from __future__ import annotations

import random

import pytest
import torch

from ..triton_env import import_kernels, kernel_devices

triton_commit = import_kernels("specdec.kernels.triton.commit")

from specdec import kernels as K  # noqa: E402
from specdec.kernels.commit import host_width  # noqa: E402

DEVICES = kernel_devices(triton_commit._commit_kernel)
POISON = -7

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def poisoned(bs: int, w: int, n: int, *, observe: bool, device="cpu") -> K.CommitOutputs:
    shapes = dict(next_tokens=(bs,), next_seq_lens=(bs,), num_committed=(bs,),
                  host=(bs, host_width(w - 1, n, observe=observe)))
    return K.CommitOutputs(*(torch.full(shapes.get(f, (bs, w)), POISON, dtype=torch.int64, device=device)
                             for f in K.CommitOutputs._fields))


def random_step(rng: random.Random, bs: int, n: int, w: int, *, ctx: int = 40, max_reqs: int = 9):
    """Rows, lengths and accepted paths of ``bs`` requests: distinct rows, each path the root then
    k increasing nodes (as a tree walk gives), -1 past k."""
    table = torch.randperm(max_reqs * ctx * 3)[: max_reqs * ctx].view(max_reqs, ctx).to(torch.int32)
    rows = torch.tensor(rng.sample(range(max_reqs), bs))
    seq_lens = torch.tensor([rng.randrange(0, ctx - n + 1) for _ in range(bs)])
    ks = [rng.randrange(0, min(w, n)) for _ in range(bs)]
    accept = torch.full((bs, w), -1, dtype=torch.int32)
    for b, k in enumerate(ks):
        path = [0] + sorted(rng.sample(range(1, n), k))
        accept[b, : k + 1] = torch.tensor(path, dtype=torch.int32) + b * n
    predicts = torch.randint(0, 1000, (bs * n,), dtype=torch.int32)
    links = torch.randint(-1, n, (2, bs, n))
    return table, rows, seq_lens, accept, torch.tensor(ks), predicts, links[0].contiguous(), links[1].contiguous()


def test_worked_example():
    """The module docstring's request: N = 4, W = 3, row 0, seq_len 10, accept_index [0, 2, -1]."""
    table = torch.zeros(1, 16, dtype=torch.int32)
    table[0, 10:14] = torch.tensor([50, 51, 52, 53])
    a, x, b, y, pad = 101, 102, 103, 104, 999
    args = (table, torch.tensor([0]), torch.tensor([10]), torch.tensor([[0, 2, -1]], dtype=torch.int32),
            torch.tensor([1]), torch.tensor([a, x, b, y], dtype=torch.int32),
            torch.zeros(1, 4, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int64))
    out = poisoned(1, 3, 4, observe=False)
    K.commit_step_ref(*args, out, num_draft_tokens=4, pad_slot=pad, park_base=-1)
    assert out.src_locs.tolist() == [[50, 52, 50]] and out.dst_locs.tolist() == [[50, 51, 50]]
    assert out.nodes.tolist() == [[0, 2, 0]] and out.tokens.tolist() == [[a, b, a]]
    assert out.next_tokens.tolist() == [b] and out.next_seq_lens.tolist() == [12] and out.num_committed.tolist() == [2]
    assert out.host.tolist() == [[0, 10, 1, a, b, a]]
    assert out.positions.tolist() == [[10, 11, 12]] and out.slots.tolist() == [[50, 51, pad]]
    aligned = poisoned(1, 3, 4, observe=True)
    K.commit_step_ref(*args, aligned, num_draft_tokens=4, pad_slot=pad, park_base=90)
    assert aligned.positions.tolist() == [[11, 12, 13]] and aligned.slots.tolist() == [[51, 90, pad]]
    assert aligned.host[0, 6:9].tolist() == [0, 2, -1]


def committed_slots(slots: torch.Tensor, accept_length: torch.Tensor, rows: torch.Tensor, *, pad_slot: int,
                    park_base: int) -> torch.Tensor:  # [bs, W]
    """The draft extend's slots as the worker's torch ops wrote them: ``slots`` [bs, W] are those of
    positions seq_len + i. Shifted draft (park_base -1): committed token i (i <= k) at seq_len + i.
    Aligned: at seq_len + 1 + i, accepted ones (i < k) in the slots after the root, the bonus (i = k)
    in the row's parking slot. Then padding."""
    k, i = accept_length[:, None], torch.arange(slots.shape[1])[None, :]
    if park_base < 0:
        return torch.where(i <= k, slots, pad_slot)
    after_root = torch.roll(slots, -1, 1)  # column i: position seq_len + 1 + i (i < W - 1)
    return torch.where(i < k, after_root, torch.where(i == k, (park_base + rows)[:, None], pad_slot))


@pytest.mark.parametrize("park_base", [-1, 300])
@pytest.mark.parametrize("bs,n,w", [(1, 2, 2), (5, 8, 6), (7, 4, 4)])
def test_reference_equals_the_torch_chain_it_replaces(bs, n, w, park_base):
    """What the worker computed op by op before the fused launch (compact_accepted_kv_locs, the
    committed tokens, the host columns, the draft extend's slots: ``committed_slots``)."""
    from specdec.eagle.draft_inputs import AlignedInputs, ShiftedInputs

    rng = random.Random(bs * 100 + n)
    table, rows, seq_lens, accept, ks, predicts, next_token, next_sibling = random_step(rng, bs, n, w)
    out = poisoned(bs, w, n, observe=True)
    pad = 999
    K.commit_step_ref(table, rows, seq_lens, accept, ks, predicts, next_token, next_sibling, out,
                      num_draft_tokens=n, pad_slot=pad, park_base=park_base)
    src, dst, pos = (torch.empty(bs, w, dtype=torch.int64) for _ in range(3))
    K.compact_accepted_kv_locs_ref(table, rows, seq_lens, accept, ks, src, dst, pos, num_draft_tokens=n)
    nodes = accept.long().clamp(min=0)
    tokens = predicts.long()[nodes]
    inputs = ShiftedInputs() if park_base < 0 else AlignedInputs(park_base)
    slots = committed_slots(dst, ks, rows, pad_slot=pad, park_base=park_base)
    prefix, _ = inputs.draft_lens(seq_lens, None)
    local = accept.long() - (torch.arange(bs) * n)[:, None]
    host = torch.cat([rows[:, None], seq_lens[:, None], ks[:, None], tokens, torch.where(accept >= 0, local, -1),
                      next_token, next_sibling], 1)
    assert torch.equal(out.src_locs, src) and torch.equal(out.dst_locs, dst)
    assert torch.equal(out.nodes, nodes) and torch.equal(out.tokens, tokens)
    assert torch.equal(out.next_tokens, tokens.gather(1, ks[:, None]).squeeze(1))
    assert torch.equal(out.next_seq_lens, seq_lens + ks + 1) and torch.equal(out.num_committed, ks + 1)
    assert torch.equal(out.positions, prefix[:, None] + torch.arange(w)) and torch.equal(out.slots, slots)
    assert torch.equal(out.host, host)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("observe", [False, True])
@pytest.mark.parametrize("park_base", [-1, 300])
@pytest.mark.parametrize("bs,n,w", [(1, 1, 1), (1, 2, 2), (3, 8, 6), (7, 32, 7), (2, 60, 7)])
def test_triton_equals_reference(bs, n, w, park_base, observe, device):
    rng = random.Random(bs * 1000 + n * 10 + w)
    args = random_step(rng, bs, n, w, ctx=80)
    theirs = poisoned(bs, w, n, observe=observe)
    K.commit_step_ref(*args, theirs, num_draft_tokens=n, pad_slot=999, park_base=park_base)
    ours = poisoned(bs, w, n, observe=observe, device=device)
    K.commit_step(*(a.to(device) for a in args), ours, num_draft_tokens=n, pad_slot=999, park_base=park_base)
    for name, a, b in zip(K.CommitOutputs._fields, ours, theirs):
        assert torch.equal(a.cpu(), b), name


@pytest.mark.parametrize("op", [K.commit_step, K.commit_step_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("bad", ["row", "accept_length", "node"])
def test_bad_input_raises(op, bad):
    rng = random.Random(5)
    table, rows, seq_lens, accept, ks, predicts, nt, ns = random_step(rng, 3, 4, 3)
    if bad == "row":
        rows[1] = 99
    elif bad == "accept_length":
        ks[2] = 3
    else:
        ks[0], accept[0, 1] = 1, 4 + 1  # request 1's node
    with pytest.raises(ValueError):
        op(table, rows, seq_lens, accept, ks, predicts, nt, ns, poisoned(3, 3, 4, observe=False),
           num_draft_tokens=4, pad_slot=999, park_base=-1)
