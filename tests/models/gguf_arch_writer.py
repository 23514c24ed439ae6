"""GGUF files of the tiny checkpoints, written the way llama.cpp's ``convert_hf_to_gguf.py`` writes
each architecture (Llama/Mistral: q/k rows permuted to interleaved pairs; Gemma 3: norms stored
as 1 + w). Float32 tensors, no tokenizer (``{arch}.vocab_size`` instead)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GEMMA3 = {**_NAMES, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
           "post_feedforward_layernorm": "post_ffw_norm"}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate_half rows -> interleaved-pair rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(name: str, t: torch.Tensor, c, arch: str) -> tuple[str, torch.Tensor]:
    base, _, suffix = name.rpartition(".")
    if base in _GLOBAL:
        out = f"{_GLOBAL[base]}.{suffix}"
    else:
        _, _, i, part = base.split(".", 3)
        out = f"blk.{i}.{(_GEMMA3 if arch == 'gemma3' else _NAMES)[part]}.{suffix}"
        if arch == "llama" and part == "self_attn.q_proj":
            t = llama_cpp_permute(t, c.num_attention_heads)
        elif arch == "llama" and part == "self_attn.k_proj":
            t = llama_cpp_permute(t, c.num_key_value_heads)
    if arch == "gemma3" and name.endswith("norm.weight"):
        t = t + 1.0
    return out, t


def write_arch_gguf(path: Path, model) -> Path:
    import gguf

    c = model.config
    arch = GGUF_ARCH[c.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_vocab_size(c.vocab_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if c.sliding_window is not None and arch == "gemma3":
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([c.is_sliding(i) for i in range(c.num_hidden_layers)])  # True: sliding
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    for name, t in model.state_dict().items():
        out, arr = _tensor(name, t.detach().float(), c, arch)
        w.add_tensor(out, np.ascontiguousarray(arr.numpy(), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
