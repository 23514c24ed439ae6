"""segment_packbits against numpy.packbits(bitorder="little"), segment by segment."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.kernels import segment_packbits

POISON = 0xA5


def test_docstring_example():
    """x = [1 0 1 1 0 0 0 0 1 | 0 1] -> [0b1101, 0b1 | 0b10]."""
    x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
    y = torch.full((3,), POISON, dtype=torch.uint8)
    segment_packbits(x, torch.tensor([0, 9, 11], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32), y, 2)
    assert y.tolist() == [13, 1, 2]


@pytest.mark.parametrize("lengths", [[1], [8], [9, 0, 17], [3, 64, 1, 13, 7], [31] * 7])
def test_matches_numpy_packbits(lengths):
    gen = torch.Generator().manual_seed(sum(lengths))
    x = torch.rand(sum(lengths), generator=gen) < 0.5
    in_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out_lens = [(n + 7) // 8 for n in lengths]
    out_ptr = np.concatenate([[0], np.cumsum(out_lens)]).astype(np.int32)
    y = torch.full((int(out_ptr[-1]) + 2,), POISON, dtype=torch.uint8)  # 2 spare bytes stay untouched
    segment_packbits(x, torch.from_numpy(in_ptr), torch.from_numpy(out_ptr), y, len(lengths))
    expected = np.concatenate(
        [np.packbits(x.numpy()[in_ptr[i] : in_ptr[i + 1]], bitorder="little") for i in range(len(lengths))]
        + [np.array([POISON, POISON], dtype=np.uint8)]
    )
    assert torch.equal(y, torch.from_numpy(expected.astype(np.uint8)))


@pytest.mark.parametrize(
    "key, bad",
    [
        ("x", torch.ones(8, dtype=torch.uint8)),
        ("input_indptr", torch.tensor([0, 8], dtype=torch.int64)),
        ("input_indptr", torch.tensor([0], dtype=torch.int32)),
        ("output_indptr", torch.tensor([0, 1], dtype=torch.int64)),
        ("y", torch.zeros(1, dtype=torch.int32)),
    ],
)
def test_validation(key, bad):
    args = dict(x=torch.ones(8, dtype=torch.bool), input_indptr=torch.tensor([0, 8], dtype=torch.int32),
                output_indptr=torch.tensor([0, 1], dtype=torch.int32), y=torch.zeros(1, dtype=torch.uint8),
                batch_size=1)
    with pytest.raises(ValueError, match=key):
        segment_packbits(**{**args, key: bad})


def test_out_of_range_segment_raises():
    with pytest.raises(ValueError, match="output_indptr"):
        segment_packbits(torch.ones(16, dtype=torch.bool), torch.tensor([0, 16], dtype=torch.int32),
                         torch.tensor([0, 2], dtype=torch.int32), torch.zeros(1, dtype=torch.uint8), 1)


@pytest.mark.parametrize(
    "key, bad",
    [
        ("x", [True] * 8),  # not a tensor
        ("input_indptr", torch.tensor([0, 0, 8, 8], dtype=torch.int32)[::2]),  # not contiguous
        ("output_indptr", torch.tensor([0, 1], dtype=torch.int32, device="meta")),  # another device
        ("y", torch.zeros(1, 1, dtype=torch.uint8)),  # 2 dims
    ],
)
def test_validation_names_the_argument_for_every_mismatch(key, bad):
    args = dict(x=torch.ones(8, dtype=torch.bool), input_indptr=torch.tensor([0, 8], dtype=torch.int32),
                output_indptr=torch.tensor([0, 1], dtype=torch.int32), y=torch.zeros(1, dtype=torch.uint8),
                batch_size=1)
    segment_packbits(**args)
    with pytest.raises(ValueError, match=f"^{key}:"):
        segment_packbits(**{**args, key: bad})
