"""Reading llama.cpp GGUF files through the ``gguf`` package (imported only when a file is read):
metadata with errors that name the file and key, and tensors dequantized to float32
(``gguf.quants.dequantize`` expands Q4_0/Q4_1/Q5_0/Q8_0/K-quants/F16/BF16).

Shared by ``gguf_loader`` (weights) and ``gguf_tokenizer`` (the embedded tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["gguf_module", "open_reader", "GGUFMeta", "f32", "dequantize"]


def gguf_module() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise ImportError(
            "loading a .gguf file needs the package 'gguf'; install it with `pip install gguf`"
        ) from e
    return gguf


def open_reader(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    return gguf_module().GGUFReader(str(path))


class GGUFMeta:
    """GGUF key/value metadata with errors that name the file and the missing key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.fields = reader.fields
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        if key not in self.fields:
            raise ValueError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return self.fields[key].contents()


def f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999974e-06 -> 1e-05),
    i.e. the value the converter wrote, so a GGUF model matches its HF original exactly."""
    return float(str(np.float32(value)))


def dequantize(tensor: Any) -> torch.Tensor:
    """A GGUF tensor as a writable float32 torch tensor in HF's [out, in] orientation."""
    arr = gguf_module().quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(s) for s in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
    arr = np.asarray(arr, dtype=np.float32).reshape(shape)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, dtype=np.float32, order="C")  # F32 tensors are views of the read-only mmap
    return torch.from_numpy(arr)
