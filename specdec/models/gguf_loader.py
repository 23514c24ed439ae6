"""llama.cpp GGUF files: Llama-architecture weights (dequantized to ``dtype``) and the embedded tokenizer.

Reading goes through the ``gguf`` package (``gguf.GGUFReader`` memory-maps the file;
``gguf.quants.dequantize`` expands Q4_0/Q4_1/Q8_0/K-quants/F16/BF16 to float32), imported only
when a GGUF file is actually loaded.

Weights: llama.cpp names map onto HF names (``blk.N.attn_q.weight`` ->
``model.layers.N.self_attn.q_proj.weight`` ...). llama.cpp's ``convert_hf_to_gguf.py`` permutes the
q/k rows of each head from HF's rotate_half order into interleaved-pair order; that permutation is
undone here, exactly as for llama2.c checkpoints. A file without ``output.weight`` has a tied head.

Tokenizer: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE, as SmolLM2 / Llama 3 / Qwen2 ship) is
rebuilt with the ``tokenizers`` package from ``tokenizer.ggml.tokens`` / ``merges``; control and
user-defined tokens (``token_type`` 3 / 4) become added special tokens, so ``<|im_start|>`` in text
encodes to its id. ``tokenizer.chat_template`` is exposed as ``chat_template``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.models.llama import LlamaConfig, LlamaForCausalLM
from specdec.models.tokenizer import TokenizersTokenizer, _require

SUPPORTED_ARCHITECTURES = ("llama",)

# llama.cpp per-layer tensor name -> HF name (without the "model.layers.N." prefix)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# llama.cpp token types (gguf.TokenType): 3 = CONTROL, 4 = USER_DEFINED
_CONTROL, _USER_DEFINED = 3, 4


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise ImportError(
            "loading a .gguf file needs the package 'gguf'; install it with `pip install gguf`"
        ) from e
    return gguf


def _reader(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    return _gguf().GGUFReader(str(path))


class _Meta:
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


def _architecture(meta: _Meta) -> str:
    arch = meta.require("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{meta.path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def read_gguf_num_layers(path: str | Path) -> int:
    """``{arch}.block_count`` of a GGUF file, without dequantizing any tensor."""
    path = Path(path)
    meta = _Meta(_reader(path), path)
    return int(meta.require(f"{_architecture(meta)}.block_count"))


def _f32(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999974e-06 -> 1e-05),
    i.e. the value the converter wrote, so a GGUF model matches its HF original exactly."""
    return float(str(np.float32(value)))


def gguf_llama_config(meta: _Meta, *, tied: bool) -> LlamaConfig:
    arch = _architecture(meta)
    k = lambda name: f"{arch}.{name}"  # noqa: E731
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(k("vocab_size"))
    if vocab is None:
        if tokens is None:
            raise ValueError(f"{meta.path}: GGUF metadata key 'tokenizer.ggml.tokens' (or {k('vocab_size')!r}) is missing")
        vocab = len(tokens)
    hidden = int(meta.require(k("embedding_length")))
    n_heads = int(meta.require(k("attention.head_count")))
    head_dim = int(meta.get(k("attention.key_length"), hidden // n_heads))
    rope_dim = meta.get(k("rope.dimension_count"))
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(f"{meta.path}: {k('rope.dimension_count')}={rope_dim} != head_dim={head_dim} (partial RoPE unsupported)")
    scaling_type = meta.get(k("rope.scaling.type"), "none")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": _f32(meta.require(k("rope.scaling.factor")))}
    elif scaling_type not in ("none", None):
        raise ValueError(f"{meta.path}: {k('rope.scaling.type')}={scaling_type!r} is not supported (none / linear)")
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta.require(k("feed_forward_length"))),
        num_hidden_layers=int(meta.require(k("block_count"))),
        num_attention_heads=n_heads,
        num_key_value_heads=int(meta.get(k("attention.head_count_kv"), n_heads)),
        head_dim=head_dim,
        rms_norm_eps=_f32(meta.require(k("attention.layer_norm_rms_epsilon"))),
        rope_theta=_f32(meta.get(k("rope.freq_base"), 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings=tied,
        max_position_embeddings=int(meta.get(k("context_length"), 2048)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )


def _hf_name(name: str) -> str | None:
    """llama.cpp tensor name -> HF name (None when it has no counterpart)."""
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def _dequantize(tensor: Any) -> torch.Tensor:
    gguf = _gguf()
    arr = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(s) for s in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
    arr = np.asarray(arr, dtype=np.float32).reshape(shape)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, dtype=np.float32, order="C")  # F32 tensors are views of the read-only mmap
    return torch.from_numpy(arr)


def load_gguf_llama(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    aux_hidden_layers: tuple[int, ...] | None = None,
) -> LlamaForCausalLM:
    """A Llama-architecture GGUF file as a ``LlamaForCausalLM`` (weights dequantized, then cast to ``dtype``)."""
    from specdec.models.loaders import _assign, _unpermute_rope

    path = Path(path)
    reader = _reader(path)
    meta = _Meta(reader, path)
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path}: rope_freqs.weight (Llama 3.1-style RoPE scaling in GGUF) is not supported")
    config = gguf_llama_config(meta, tied="output.weight" not in names)
    state: dict[str, torch.Tensor] = {}
    unknown = []
    for tensor in reader.tensors:
        hf = _hf_name(tensor.name)
        if hf is None:
            unknown.append(tensor.name)
            continue
        w = _dequantize(tensor)
        if tensor.name.endswith("attn_q.weight"):
            w = _unpermute_rope(w, config.num_attention_heads)
        elif tensor.name.endswith("attn_k.weight"):
            w = _unpermute_rope(w, config.num_key_value_heads)
        state[hf] = w.contiguous()
    if unknown:
        raise ValueError(f"{path}: GGUF tensors with no Llama counterpart: {unknown[:8]}")
    with torch.device("meta"):
        model = LlamaForCausalLM(config, aux_hidden_layers=aux_hidden_layers, dtype=dtype, device="meta")
    _assign(model, state, what=f"GGUF {path}", dtype=dtype, device=device)
    return model.eval()


# ----------------------------------------------------------------------------- tokenizer


def _pre_tokenizer(tokenizers: Any, pre: str | None, add_prefix_space: bool) -> Any:
    """The pre-tokenizer llama.cpp's ``tokenizer.ggml.pre`` names (GPT-2's regex by default)."""
    pt = tokenizers.pre_tokenizers
    byte_level = pt.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre == "smollm":  # llama.cpp: "\p{N}" then GPT-2's regex == HF's Digits(individual) + ByteLevel
        return pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    if pre not in (None, "default", "gpt2", "gpt-2"):
        warnings.warn(f"GGUF tokenizer.ggml.pre={pre!r}: using GPT-2's pre-tokenizer regex", stacklevel=3)
    return byte_level


class GGUFTokenizer(TokenizersTokenizer):
    """Byte-level BPE tokenizer stored in a GGUF file; same interface as ``HFTokenizer``."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        tokenizers = _require("tokenizers", f"the tokenizer in {path}")
        meta = _Meta(_reader(path), path)
        kind = meta.require("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{path}: tokenizer.ggml.model={kind!r} is not supported (only 'gpt2' byte-level BPE)")
        tokens = [str(t) for t in meta.require("tokenizer.ggml.tokens")]
        merges = [str(m) for m in meta.get("tokenizer.ggml.merges", [])]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"{path}: malformed tokenizer.ggml.merges entry {m!r}")
            pairs.append((a, b))
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        tok.pre_tokenizer = _pre_tokenizer(
            tokenizers, meta.get("tokenizer.ggml.pre"), bool(meta.get("tokenizer.ggml.add_space_prefix", False))
        )
        tok.decoder = tokenizers.decoders.ByteLevel()
        special = [
            tokenizers.AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types) if int(ty) == _CONTROL
        ]
        user = [
            tokenizers.AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if int(ty) == _USER_DEFINED
        ]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)
        self.tok = tok
        self.vocab_size = len(tokens)
        bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
        self.bos_token_id = None if bos is None else int(bos)
        self.eos_token_id = None if eos is None else int(eos)
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", self.bos_token_id is not None))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")


def load_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    return GGUFTokenizer(path)
