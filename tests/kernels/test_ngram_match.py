"""``ngram_match`` (the n-gram drafter's lookup on the device): the module docstring's worked example,
the reference against the host's ``propose_ngram_ref``, then Triton == reference exactly (CPU through
Triton's interpreter, CUDA compiled) on random repetitive histories, and input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ..triton_env import import_kernels, kernel_devices

triton_ngram = import_kernels("specdec.kernels.triton.ngram_match")

from specdec import kernels as K  # noqa: E402
from specdec.ngram.lookup import propose_ngram_ref  # noqa: E402

DEVICES = kernel_devices(triton_ngram._ngram_match_kernel)
pytestmark = pytest.mark.usefixtures("triton_interpreter")


def kv_batch(histories: list[list[int]], *, ctx: int = 96, seed: int = 0, device="cpu") -> dict:
    """Each history but its last token (the root) in KV at shuffled slots of table rows 2b + 1; the
    slots' token ids in ``slot_tokens`` (the others poisoned)."""
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * len(histories) + 1
    req_to_token = torch.randperm(rows * ctx, generator=gen).view(rows, ctx).to(torch.int32)
    slot_tokens = torch.full((rows * ctx,), -5, dtype=torch.int64)
    for b, h in enumerate(histories):
        slot_tokens[req_to_token[2 * b + 1, : len(h) - 1].long()] = torch.tensor(h[:-1], dtype=torch.int64)
    return dict(slot_tokens=slot_tokens.to(device), req_to_token=req_to_token.to(device),
                req_pool_indices=torch.tensor([2 * b + 1 for b in range(len(histories))], device=device),
                seq_lens=torch.tensor([len(h) - 1 for h in histories], device=device),
                roots=torch.tensor([h[-1] for h in histories], device=device))


def run(impl, batch: dict, k: int, *, lens_dtype=torch.int64, **kw) -> tuple[list[list[int]], list[int]]:
    """Each request's chain (root, then k entries) and draft length, as ``impl`` writes them."""
    bs = batch["roots"].shape[0]
    device = batch["roots"].device
    chains = torch.full((bs, k + 1), -1, dtype=torch.int64, device=device)
    lens = torch.full((bs,), -1, dtype=lens_dtype, device=device)
    impl(**batch, chains=chains, draft_lens=lens, **kw)
    return chains.cpu().tolist(), lens.cpu().tolist()


def expected(histories: list[list[int]], k: int, *, min_n: int, max_n: int):
    chains, lens = [], []
    for h in histories:
        d = propose_ngram_ref(np.asarray(h), min_n=min_n, max_n=max_n, k=k, repeat=True).tolist()
        chains.append([h[-1]] + d + [h[-1]] * (k - len(d)))
        lens.append(len(d))
    return chains, lens


def test_worked_example():
    """The lookup module's example: "5 9" ends last at p = 5, so the draft is 7 8 5 after the root 9; a
    row with no match drafts nothing and holds its root."""
    histories = [[5, 9, 7, 2, 5, 9, 7, 8, 5, 9], [1, 2, 3, 4]]
    chains, lens = run(K.ngram_match_ref, kv_batch(histories), 3, min_n=1, max_n=3)
    assert chains == [[9, 7, 8, 5], [4, 4, 4, 4]] and lens == [3, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_repeat_continues_past_the_history(device):
    """A run of 7s: the latest "7 7 7" ends one token before the end, so the draft continues the run (cut
    there it would be one token); "1 2" of period two continues 1 2 1 2; "3 4 5" ends at 2 and 5: the
    latest leaves 3 tokens, 3 4 5, continued to 3 4 5 3 4."""
    histories = [[4, 7, 7, 7, 7], [5, 1, 2, 1, 2], [3, 4, 5, 3, 4, 5, 3, 4, 5]]
    want = ([[7, 7, 7, 7, 7, 7], [2, 1, 2, 1, 2, 1], [5, 3, 4, 5, 3, 4]], [5, 5, 5])
    for impl in (K.ngram_match_ref, triton_ngram.ngram_match):
        assert run(impl, kv_batch(histories, device=device), 5, min_n=1, max_n=3) == want


def random_histories(seed: int, longest: int = 90) -> list[list[int]]:
    """Histories that repeat spans of a small vocabulary (many matches of every length), of 1-``longest``
    tokens, one whose match runs into the root, one of a single token."""
    rng = np.random.default_rng(seed)
    out = [[7], [3, 4, 5, 3, 4, 5, 3, 4]]
    for _ in range(6):
        base = rng.integers(0, 6, size=int(rng.integers(4, 20))).tolist()
        h = []
        while len(h) < int(rng.integers(2, longest)):
            start = int(rng.integers(0, len(base)))
            h += base[start: start + int(rng.integers(1, 8))]
            h += rng.integers(0, 6, size=int(rng.integers(0, 2))).tolist()
        out.append(h[:longest])
    return out


@pytest.mark.parametrize("min_n,max_n,k", [(1, 3, 4), (2, 5, 7), (1, 12, 11), (3, 3, 1)])
def test_reference_equals_host_lookup(min_n, max_n, k):
    for seed in range(3):
        histories = random_histories(seed)
        assert run(K.ngram_match_ref, kv_batch(histories, seed=seed), k, min_n=min_n, max_n=max_n) == \
            expected(histories, k, min_n=min_n, max_n=max_n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("min_n,max_n,k", [(1, 3, 4), (2, 5, 7), (1, 12, 11)])
def test_triton_equals_reference(device, min_n, max_n, k):
    for seed in range(2):
        histories = random_histories(seed + 10)
        want = expected(histories, k, min_n=min_n, max_n=max_n)
        batch = kv_batch(histories, seed=seed, device=device)
        assert run(triton_ngram.ngram_match, batch, k, min_n=min_n, max_n=max_n) == want
        # slot ids and draft lengths in int32 as well
        batch32 = {**batch, "slot_tokens": batch["slot_tokens"].to(torch.int32)}
        assert run(triton_ngram.ngram_match, batch32, k, lens_dtype=torch.int32, min_n=min_n, max_n=max_n) == want


def test_long_history_crosses_blocks():
    """A history of 700 tokens (three of the kernel's 256-position blocks): the latest match wins."""
    rng = np.random.default_rng(4)
    h = rng.integers(0, 50, size=700).tolist()
    h[100:104] = h[600:604] = h[-4:] = [60, 61, 62, 63]  # "60 61 62 63" also ends at 103 and 603: 603 is latest
    batch = kv_batch([h], ctx=720)
    want = expected([h], 5, min_n=1, max_n=4)
    assert want[0][0] == [h[-1]] + h[604:609]
    assert run(K.ngram_match, batch, 5, min_n=1, max_n=4) == want
    assert run(K.ngram_match_ref, batch, 5, min_n=1, max_n=4) == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("span", [256, 512])
def test_split_programs_merge_to_the_same_chains(device, span):
    """A history split over programs of ``span`` positions (up to four here): the merged match is the
    one program's, and the merge state is left idle for the next launch, which reuses it."""
    merge = K.ngram_merge_buffer(8, device)
    for seed in range(2):
        histories = random_histories(seed + 20, longest=1000)
        batch = kv_batch(histories, ctx=1000, seed=seed, device=device)
        want = expected(histories, 6, min_n=1, max_n=4)
        assert run(triton_ngram.ngram_match, batch, 6, min_n=1, max_n=4, span=span, merge=merge) == want
        assert merge[0].eq(-1).all() and merge[1].eq(0).all()
    assert run(triton_ngram.ngram_match, batch, 6, min_n=1, max_n=4, span=span) == want  # its own state


def test_split_span():
    assert triton_ngram.split_span(96) == (1024, 1)
    assert triton_ngram.split_span(8192) == (1024, 8)
    assert triton_ngram.split_span(1_000_000) == (15872, 64)  # at most 64 programs, whole 256-position blocks
    assert triton_ngram.split_span(1000, 300) == (512, 2)
    with pytest.raises(ValueError, match="span"):
        triton_ngram.split_span(1000, 0)


@pytest.mark.parametrize("impl", [K.ngram_match_ref, K.ngram_match])
def test_input_errors(impl):
    batch = kv_batch([[1, 2, 1, 2]])
    with pytest.raises(ValueError, match="seq_lens"):
        run(impl, {**batch, "seq_lens": torch.tensor([500])}, 2, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="req_pool_indices"):
        run(impl, {**batch, "req_pool_indices": torch.tensor([99])}, 2, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="min_n"):
        K.ngram_match(**batch, chains=torch.zeros(1, 3, dtype=torch.int64),
                      draft_lens=torch.zeros(1, dtype=torch.int64), min_n=3, max_n=2)
    with pytest.raises(ValueError, match="chains"):
        K.ngram_match(**batch, chains=torch.zeros(1, 6, dtype=torch.int64)[:, ::2],
                      draft_lens=torch.zeros(1, dtype=torch.int64), min_n=1, max_n=2)


def test_merge_state_errors():
    batch = kv_batch([[1, 2, 1, 2]])
    out = dict(chains=torch.zeros(1, 3, dtype=torch.int64), draft_lens=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="merge"):
        triton_ngram.ngram_match(**batch, **out, min_n=1, max_n=2, merge=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="merge"):
        triton_ngram.ngram_match(**batch, **out, min_n=1, max_n=2, merge=torch.zeros(1, 4, dtype=torch.int64))
