"""``specdec.models.ops.topk.softmax_topk``: the draft's top-k over its vocabulary; ``argmax``:
greedy's token, equal to torch's argmax.

1. The kernels against the reference, CPU through Triton's interpreter (small vocabularies split
   into several chunks, the last one ragged) and, marked ``gpu``, compiled at the draft's shapes and
   inside a CUDA graph: the same token ids in the same order, probabilities within fp32 rounding.
2. The module's promises the reference leaves open: among equal logits the lowest id first; rows
   with fewer than k finite logits still get ids inside the vocabulary.
3. Dispatch and input errors.
"""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels, rand

tk = import_kernels("specdec.models.ops.topk_kernels")

from specdec.models.ops import topk  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
INTERPRETED = type(tk._chunk_topk_kernel).__name__ == "InterpretedFunction"


def assert_matches_ref(logits: torch.Tensor, k: int, probs: torch.Tensor, ids: torch.Tensor) -> None:
    """The reference's probabilities, and its ids in the order the module promises (torch.topk's
    order of ties is open, so the ids are checked against a stable sort of the logits)."""
    ref_probs, _ = topk.softmax_topk_ref(logits, k)
    order = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    assert probs.dtype == torch.float32 and ids.dtype == torch.int64
    assert probs.shape == ids.shape == (logits.shape[0], k)
    assert torch.equal(ids.cpu(), order.cpu())
    torch.testing.assert_close(probs.cpu(), ref_probs.cpu(), rtol=2e-6 if INTERPRETED else 1e-5, atol=1e-9)


# ============================================================================= kernels vs reference
@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("rows,vocab,k,block", [(1, 100, 1, 32), (3, 100, 8, 32), (5, 257, 4, 64),
                                                (2, 64, 16, 16), (4, 50, 3, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernels_match_ref_interpreted(rows, vocab, k, block, dtype):
    logits = rand(rows, vocab, seed=rows * vocab + k, scale=4.0).to(dtype)
    probs, ids = tk.softmax_topk(logits, k, block=block)
    assert_matches_ref(logits, k, probs, ids)


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
def test_id_map_interpreted():
    """A draft vocab's target ids (EAGLE-3's d2t, EAGLE-2's hot tokens) read in the merge."""
    logits = rand(3, 100, seed=7, scale=4.0)
    id_map = torch.randperm(5000, generator=torch.Generator().manual_seed(1))[:100]
    probs, ids = tk.softmax_topk(logits, 6, id_map=id_map, block=32)
    ref_probs, ref_ids = topk.softmax_topk_ref(logits, 6, id_map=id_map)
    assert torch.equal(ids, id_map[torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :6]])
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(probs, ref_probs, rtol=2e-6, atol=1e-9)


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
def test_strided_rows_interpreted():
    """Rows of a wider tensor (padded logits) read in place."""
    wide = rand(4, 120, seed=3, scale=3.0)
    probs, ids = tk.softmax_topk(wide[:, :97], 5, block=32)
    assert_matches_ref(wide[:, :97].contiguous(), 5, probs, ids)


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
def test_ties_take_the_lowest_id_first_interpreted():
    """Equal logits within a chunk and across chunks come out lowest id first."""
    logits = torch.full((2, 70), -5.0)
    logits[0, [3, 40, 9, 66]] = 2.0  # chunks of 16: ids 3 and 9 share a chunk, 40 and 66 do not
    logits[1, [60, 1]] = 1.0
    logits[1, 30] = 3.0
    probs, ids = tk.softmax_topk(logits, 4, block=16)
    assert ids.tolist() == [[3, 9, 40, 66], [30, 1, 60, 0]]
    torch.testing.assert_close(probs, torch.softmax(logits, -1).gather(1, ids), rtol=2e-6, atol=0)


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
def test_rows_with_few_finite_logits_interpreted():
    """Fewer than k logits above -inf: the finite ones first, every id inside the vocabulary."""
    logits = torch.full((2, 40), float("-inf"))
    logits[0, 7] = 0.0
    logits[0, 35] = -1.0
    probs, ids = tk.softmax_topk(logits, 4, block=16)
    assert ids[0, :2].tolist() == [7, 35]
    torch.testing.assert_close(probs[0, :2], torch.softmax(logits[0], -1)[[7, 35]], rtol=2e-6, atol=0)
    assert ((ids >= 0) & (ids < 40)).all()
    assert (probs[0, 2:] == 0).all() and torch.isnan(probs[1]).all()  # an all -inf row has no softmax


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("rows,vocab,block", [(1, 100, 32), (3, 100, 16), (5, 257, 64), (2, 50, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_argmax_equals_torch_interpreted(rows, vocab, block, dtype):
    """Random rows, then the promises: ties within and across chunks take the first column, a NaN
    wins (the first one), an all -inf row gives 0, rows of a wider tensor are read in place."""
    logits = rand(rows, vocab, seed=rows * vocab, scale=4.0).to(dtype)
    assert torch.equal(tk.argmax(logits, block=block), logits.argmax(-1))
    logits = torch.full((5, vocab), -3.0, dtype=dtype)
    logits[0, [vocab - 1, 17, 3]] = 2.0  # ties: 3 and 17 share a chunk of 16 or 32, vocab - 1 does not
    logits[1, [vocab - 2, 40]] = float("nan")
    logits[1, 5] = float("inf")
    logits[2] = float("-inf")
    logits[3, vocab - 1] = 1.0
    logits[4, [2, vocab - 3]] = float("inf")
    wide = torch.cat([logits, torch.full((5, 7), 9.0, dtype=dtype)], dim=1)[:, :vocab]  # strided rows
    for x in (logits, wide):
        out = tk.argmax(x, block=block)
        assert torch.equal(out, x.argmax(-1)) and out.tolist() == [3, 40, 0, vocab - 1, 2]


# ============================================================================= dispatch
@pytest.fixture
def kernel_on_cpu(monkeypatch):
    """Let the dispatch take the kernels for CPU tensors; records each launch's k."""
    if not INTERPRETED:
        pytest.skip("needs the interpreter")
    monkeypatch.setattr(topk, "_applies", lambda device: True)
    calls = []
    launch = tk.softmax_topk

    def counted(logits, k, id_map=None):
        calls.append(k)
        return launch(logits, k, id_map=id_map)

    monkeypatch.setattr(tk, "softmax_topk", counted)
    return calls


def test_dispatch(kernel_on_cpu):
    logits = rand(3, 300, seed=1, scale=4.0)
    assert_matches_ref(logits, 8, *topk.softmax_topk(logits, 8))
    assert kernel_on_cpu == [8]
    # the reference: k past the unrolled passes, autograd, float64
    assert torch.equal(topk.softmax_topk(logits, topk.MAX_K + 1)[1], topk.softmax_topk_ref(logits, topk.MAX_K + 1)[1])
    topk.softmax_topk(logits.clone().requires_grad_(), 2)
    topk.softmax_topk(logits.double(), 2)
    assert kernel_on_cpu == [8]


def test_argmax_dispatch(monkeypatch):
    """The kernels for float rows where they apply; float64 and plain CPU take the reference."""
    logits = rand(3, 300, seed=4, scale=4.0)
    assert torch.equal(topk.argmax(logits), logits.argmax(-1))  # CPU: the reference
    if not INTERPRETED:
        return
    monkeypatch.setattr(topk, "_applies", lambda device: True)
    calls = []
    launch = tk.argmax
    monkeypatch.setattr(tk, "argmax", lambda x: calls.append(x.dtype) or launch(x))
    assert torch.equal(topk.argmax(logits), logits.argmax(-1))
    assert torch.equal(topk.argmax(logits.double()), logits.argmax(-1))
    assert calls == [torch.float32]
    with pytest.raises(ValueError, match="logits"):
        topk.argmax(torch.zeros(4))


def test_cpu_runs_the_reference():
    logits = rand(2, 50, seed=2)
    out, ref = topk.softmax_topk(logits, 3), topk.softmax_topk_ref(logits, 3)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("logits,k,match", [(torch.zeros(5), 1, "logits"), (torch.zeros(2, 4), 0, "k"),
                                           (torch.zeros(2, 4), 5, "k")])
def test_bad_input_names_the_argument(logits, k, match):
    with pytest.raises(ValueError, match=match):
        topk.softmax_topk(logits, k)
    for id_map in (torch.arange(3), torch.arange(4, dtype=torch.int32)):
        with pytest.raises(ValueError, match="id_map"):
            topk.softmax_topk(torch.zeros(2, 4), 1, id_map=id_map)


# ============================================================================= GPU
@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [32000, 128256])
@pytest.mark.parametrize("rows,k", [(1, 1), (8, 8), (64, 4), (512, 10), (4, 16)])
def test_gpu_kernels_match_ref(rows, vocab, k):
    logits = rand(rows, vocab, seed=rows + k, scale=3.0, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):  # bf16 logits tie often
        assert_matches_ref(logits.to(dtype), k, *topk.softmax_topk(logits.to(dtype), k))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 64, 256])
def test_gpu_argmax_equals_torch(rows):
    logits = rand(rows, 128256, seed=rows, scale=3.0, device="cuda")
    logits[0, 5000:5003] = logits.max() + 1  # a tie across columns
    for x in (logits, logits.to(torch.bfloat16)):  # bf16 logits tie often
        assert torch.equal(topk.argmax(x), x.argmax(-1))
    logits[-1, [90000, 7]] = float("nan")
    assert topk.argmax(logits)[-1].item() == logits.argmax(-1)[-1].item() == 7


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    logits = rand(16, 32000, seed=5, scale=3.0, device="cuda")
    eager = topk.softmax_topk(logits, 8)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = topk.softmax_topk(logits, 8)
    logits.copy_(rand(16, 32000, seed=6, scale=3.0, device="cuda"))
    graph.replay()
    fresh = topk.softmax_topk(logits, 8)
    assert torch.equal(captured[1], fresh[1]) and torch.equal(captured[0], fresh[0])
    assert not torch.equal(captured[1], eager[1])
