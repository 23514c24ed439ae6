"""CudaGraphRunner's padding and slicing, run eagerly on CPU (the same code path as replay)."""

import pytest
import torch

from specdec.cuda_graph import CudaGraphRunner, StaticInput, default_batch_sizes


def test_default_batch_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(5) == [1, 2, 3, 4, 5]
    assert default_batch_sizes(20) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 20]
    assert default_batch_sizes(64)[-3:] == [48, 56, 64]
    with pytest.raises(ValueError, match="cuda-graph-max-bs"):
        default_batch_sizes(0)


def _runner(seen):
    def fn(x, rows):
        seen.append((x.clone(), rows.clone()))
        # [bs * 2, 3] and [bs] outputs
        return x * 2, rows + 100

    inputs = [StaticInput("x", 2, torch.float32, (3,), pad_value=-1.0), StaticInput("rows", 1, torch.int64, pad_value=7)]
    return CudaGraphRunner(fn, inputs, [1, 2, 4, 8], device="cpu")


def test_pads_to_the_next_size_and_slices_outputs():
    seen = []
    runner = _runner(seen)
    assert [runner.padded_size(b) for b in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    x = torch.arange(30, dtype=torch.float32).view(10, 3)  # bs 5, two rows per request
    doubled, rows = runner(5, x=x, rows=torch.arange(5))
    assert torch.equal(doubled, x * 2) and torch.equal(rows, torch.arange(5) + 100)
    seen_x, seen_rows = seen[-1]
    assert seen_x.shape == (16, 3) and torch.equal(seen_x[10:], torch.full((6, 3), -1.0))
    assert torch.equal(seen_rows[5:], torch.full((3,), 7))


def test_a_smaller_batch_refills_padding_left_by_a_larger_one():
    seen = []
    runner = _runner(seen)
    runner(7, x=torch.ones(14, 3), rows=torch.arange(7))
    runner(5, x=torch.zeros(10, 3), rows=torch.arange(5))
    seen_x, seen_rows = seen[-1]
    assert torch.equal(seen_x[10:], torch.full((6, 3), -1.0)), "rows 5..6 of the bs-7 call must be padding again"
    assert torch.equal(seen_rows[5:], torch.full((3,), 7))


def test_a_writer_fills_its_rows_and_padding_stays():
    """An input given as a writer fills the real rows of its buffer itself (here from a gather);
    the rows past them keep the pad value, also after a larger batch wrote there."""
    seen = []
    runner = _runner(seen)
    source = torch.arange(60, dtype=torch.float32).view(20, 3)
    picks = torch.tensor([4, 0, 19, 7, 7, 3, 11, 2, 5, 6])
    runner(7, x=torch.ones(14, 3), rows=torch.arange(7))
    doubled, _ = runner(5, x=lambda rows: torch.index_select(source, 0, picks, out=rows), rows=torch.arange(5))
    assert torch.equal(doubled, source[picks] * 2)
    seen_x, _ = seen[-1]
    assert torch.equal(seen_x[:10], source[picks]) and torch.equal(seen_x[10:], torch.full((6, 3), -1.0))


def test_row_views_are_made_once_a_size():
    """The rows a call fills (and ``rows`` hands a caller) are the same view objects call after call,
    one per input and batch size; the values follow each call."""
    seen = []
    runner = _runner(seen)
    x5, x3 = runner.rows("x", 5), runner.rows("x", 3)
    assert x5.shape == (10, 3) and x3.shape == (6, 3) and x5.data_ptr() == x3.data_ptr()
    runner(5, x=torch.ones(10, 3), rows=torch.arange(5))
    runner(3, x=torch.full((6, 3), 2.0), rows=torch.arange(3))
    assert runner.rows("x", 5) is x5 and runner.rows("x", 3) is x3
    assert torch.equal(x3, torch.full((6, 3), 2.0)) and torch.equal(x5[6:], torch.full((4, 3), -1.0))
    assert len(runner._row_views) == 2 * 4  # x and rows, each at 5, 3 and the padded sizes 8, 4


def test_rejects_wrong_inputs_and_sizes():
    runner = _runner([])
    assert runner.can_run(8) and not runner.can_run(9) and not runner.can_run(0)
    with pytest.raises(ValueError, match="outside the captured sizes"):
        runner(9, x=torch.zeros(18, 3), rows=torch.arange(9))
    with pytest.raises(ValueError, match="input x has shape"):
        runner(2, x=torch.zeros(3, 3), rows=torch.arange(2))
    with pytest.raises(ValueError, match="expected inputs"):
        runner(2, x=torch.zeros(4, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_release_destroys_the_graphs_and_later_calls_run_eagerly():
    calls = []

    def fn(x):
        calls.append(torch.cuda.is_current_stream_capturing())
        return (x + 1,)

    runner = CudaGraphRunner(fn, [StaticInput("x", 1, torch.float32, (4,))], [1, 2], device="cuda")
    runner.capture()
    assert runner.memory_bytes >= 0 and len(runner._graphs) == 2 and any(calls)
    calls.clear()
    x = torch.arange(8, dtype=torch.float32, device="cuda").view(2, 4)
    assert torch.equal(runner(2, x=x)[0], x + 1) and not calls  # replayed: fn not called
    runner.release()
    assert not runner._graphs and not runner.use_graphs and runner.memory_bytes == 0
    assert torch.equal(runner(2, x=x)[0], x + 1) and calls == [False]  # eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_outputs_are_the_first_rows_of_each_call():
    """The output views a replay returns are made once per (captured size, batch size) and show each
    replay's values."""
    runner = CudaGraphRunner(lambda x: (x * 3,), [StaticInput("x", 2, torch.float32)], [2, 4], device="cuda")
    runner.capture()
    for bs in (3, 1, 3, 4):
        x = torch.arange(2 * bs, dtype=torch.float32, device="cuda") + bs
        (out,) = runner(bs, x=x)
        assert out.shape == (2 * bs,) and torch.equal(out, x * 3)
    assert runner(3, x=torch.zeros(6, device="cuda"))[0] is runner(3, x=torch.ones(6, device="cuda"))[0]
