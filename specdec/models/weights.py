"""Checkpoint files to a model's Parameters: the one place every loader (HF, llama2.c, GGUF, draft
heads) goes through, so none of them imports another.

``assign_weights`` is exact: missing, unexpected or mis-shaped names raise a ``ValueError`` naming
them. ``random_state`` stands in for a checkpoint's tensors under ``--load-format dummy``. With tensor parallelism the state is sliced to this rank's shard first
(``specdec.models.parallel.shard_state_dict``), so a rank never holds more than one full tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["read_config", "read_target_hf_config", "merged_ids", "read_state_dict", "weight_names", "assign_weights",
           "random_state", "unpermute_rope"]


def read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"{path}: no config.json")
    return json.loads(file.read_text())


def read_target_hf_config(path: Path) -> dict[str, Any]:
    """A target's ``config.json``, its ``eos_token_id`` widened by ``generation_config.json``'s: the
    ids a chat model ends a turn with often stand only there (Gemma 3's ``<end_of_turn>``, Llama 3's
    ``<|eot_id|>``), and HF's ``generate``, vLLM and SGLang all stop at them."""
    config = read_config(path)
    file = path / "generation_config.json"
    if file.is_file():
        extra = json.loads(file.read_text()).get("eos_token_id")
        config["eos_token_id"] = merged_ids(config.get("eos_token_id"), extra)
    return config


def merged_ids(*fields: int | list[int] | None) -> int | list[int] | None:
    """``eos_token_id`` fields (each one id, a list, or absent) as one: their ids in order without repeats,
    a single id as itself, none as None."""
    ids = list(dict.fromkeys(int(i) for f in fields if f is not None
                             for i in (f if isinstance(f, (list, tuple)) else [f])))
    return None if not ids else ids[0] if len(ids) == 1 else ids


def _weight_files(path: Path) -> list[Path]:
    """``*.safetensors`` files of a directory; with ``model.safetensors.index.json``, the shards it names."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ValueError(f"{index}: shard file(s) {missing[:4]} are missing")
        return [path / s for s in shards]
    return sorted(path.glob("*.safetensors"))


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of ``*.safetensors`` (preferred) or ``pytorch_model*.bin`` files in a directory."""
    path = Path(path)
    files = _weight_files(path)
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(str(f)))
        return state
    files = sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors or pytorch_model*.bin weight files")
    for f in files:
        state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return state


def weight_names(path: Path) -> list[str]:
    """Tensor names of a checkpoint directory, read from the safetensors headers when possible."""
    files = _weight_files(path)
    if files:
        from safetensors import safe_open

        names = []
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                names.extend(fh.keys())
        return names
    return list(read_state_dict(path))


def assign_weights(
    model: nn.Module, state: dict[str, torch.Tensor], *, what: str, dtype: torch.dtype, device: Any
) -> None:
    """Load ``state`` into ``model`` exactly: missing, unexpected or mis-shaped names raise."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what}: missing weights {missing[:8]}; unexpected weights {unexpected[:8]}")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise ValueError(f"{what}: weight {name} has shape {tuple(state[name].shape)}, expected {tuple(ref.shape)}")
    cast = {}
    for name, t in state.items():
        t = t.to(device=device, dtype=dtype if t.is_floating_point() else expected[name].dtype)
        # NOTE: safetensors hands out tensors at arbitrary offsets of one buffer; CPU matmul kernels
        # pick paths by alignment, so an unaligned copy would not reproduce outputs bit for bit.
        cast[name] = t.clone() if t.data_ptr() % 64 or not t.is_contiguous() else t
    model.load_state_dict(cast, strict=True, assign=True)


def random_state(
    model: nn.Module, *, seed: int, dtype: torch.dtype, device: Any, given: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Random weights of ``model``'s shapes (``--load-format dummy``): what ``given`` lacks, drawn on
    ``device`` from ``seed``. Matrices ~ N(0, 1/fan_in), so activations keep their scale through
    the layers; norm weights 1; other floats (biases) 0; integer and bool buffers 0.
    ``model`` may live on the meta device: only its state dict's names, shapes and dtypes are read."""
    gen = torch.Generator(device=device).manual_seed(seed)
    state = dict(given or {})
    for name, ref in model.state_dict().items():
        if name in state:
            continue
        if not ref.is_floating_point():
            state[name] = torch.zeros(ref.shape, dtype=ref.dtype, device=device)
        elif name.endswith("norm.weight"):
            state[name] = torch.ones(ref.shape, dtype=dtype, device=device)
        elif ref.dim() == 2:
            w = torch.empty(ref.shape, dtype=dtype, device=device)
            state[name] = w.normal_(0.0, ref.shape[-1] ** -0.5, generator=gen)
        else:
            state[name] = torch.zeros(ref.shape, dtype=dtype, device=device)
    return state


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a llama2.c / llama.cpp-Llama q/k projection -> HF rotate_half order.

    llama2.c rotates interleaved pairs (0,1), (2,3), ... of each head; HF rotates (i, i + D/2).
    Per head, row 2i moves to i and row 2i+1 to i + D/2, e.g. D=4: rows [0,1,2,3] -> [0,2,1,3].
    """
    out_f, in_f = w.shape
    d = out_f // n_heads
    return w.view(n_heads, d // 2, 2, in_f).transpose(1, 2).reshape(out_f, in_f)
