"""Load targets (HF safetensors directories, llama2.c ``.bin``) and EAGLE / EAGLE-3 draft heads.

Draft-head directories are loaded unchanged in the formats SGLang and the EAGLE repository
publish: ``config.json`` with ``architectures`` plus ``*.safetensors`` or ``pytorch_model.bin``.
Anything that does not fit the target raises a ``ValueError`` naming the field and both values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.gguf_loader import load_gguf_target, read_gguf_config, read_gguf_num_layers
from specdec.models.llama import LlamaConfig, LlamaForCausalLM, default_eagle3_layers
from specdec.models.parallel import SINGLE, TPGroup, draft_head_group, shard_state_dict
from specdec.models.registry import build_target, config_from_hf
from specdec.models.weights import (
    assign_weights, random_state, read_config, read_state_dict, read_target_hf_config, unpermute_rope, weight_names,
)

DraftModel = EagleDraftModel | Eagle3DraftModel
EAGLE_ARCH = "LlamaForCausalLMEagle"
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
# llama2.c "version 1+" exports start with this magic instead of the legacy 7-int header
_LLAMA2C_MAGIC = 0x616B3432


def read_num_layers(path: str | Path) -> int:
    """num_hidden_layers of a target checkpoint (HF directory, llama2.c .bin, .gguf) without loading it."""
    path = Path(path)
    if path.suffix == ".gguf":
        return read_gguf_num_layers(path)
    return read_target_config(path).num_hidden_layers


def read_target_config(path: str | Path) -> LlamaConfig:
    """The config of a target checkpoint (HF directory, llama2.c .bin, .gguf) without its weights."""
    path = Path(path)
    if path.is_dir():
        return config_from_hf(read_target_hf_config(path))
    if path.suffix == ".gguf":
        return read_gguf_config(path)
    return _llama2c_config(path)


# ----------------------------------------------------------------------------- targets


LOAD_FORMATS = ("auto", "dummy")


def check_load_format(load_format: str) -> None:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format={load_format!r}: choose one of {', '.join(LOAD_FORMATS)}")


def load_target(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    aux_hidden_layers: tuple[int, ...] | None = None,
    tp: TPGroup = SINGLE,
    load_format: str = "auto",
    seed: int = 0,
) -> LlamaForCausalLM:
    """A directory is an HF checkpoint; a ``.bin`` file a llama2.c checkpoint; a ``.gguf`` file llama.cpp's.

    ``tp``: build rank ``tp.rank``'s shard of the model (the checkpoint is read whole and sliced).
    ``load_format="dummy"``: only the config is read; the weights are random (``random_state``, from
    ``seed``), for benchmarks of a model's shape without its weights (SGLang's and vLLM's
    ``--load-format dummy``).
    """
    check_load_format(load_format)
    path = Path(path)
    kw = dict(dtype=dtype, device=device, aux_hidden_layers=aux_hidden_layers, tp=tp)
    if load_format == "dummy":
        return build_target(read_target_config(path), None, what=f"target {path} (dummy weights)", seed=seed, **kw)
    if path.is_dir():
        return load_hf_target(path, **kw)
    if path.suffix == ".gguf" and path.is_file():
        return load_gguf_target(path, **kw)
    if path.suffix == ".bin" and path.is_file():
        return load_llama2c(path, **kw)
    raise ValueError(f"--model-path {path}: expected an HF checkpoint directory, a llama2.c .bin file or a .gguf file")


def load_hf_target(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    aux_hidden_layers: tuple[int, ...] | None = None,
    tp: TPGroup = SINGLE,
) -> LlamaForCausalLM:
    """An HF checkpoint directory of any registered architecture (``specdec.models.registry``)."""
    path = Path(path)
    config = config_from_hf(read_target_hf_config(path))
    state = read_state_dict(path)
    # Old checkpoints carry rotary tables; tied checkpoints may still carry a copy of the head.
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    return build_target(config, state, what=f"target {path}", dtype=dtype, device=device,
                        aux_hidden_layers=aux_hidden_layers, tp=tp)


load_hf_llama = load_hf_target  # the name before the registry


def _llama2c_header(path: Path) -> np.ndarray:
    header = np.fromfile(path, dtype=np.int32, count=7)
    if header.shape[0] < 7:
        raise ValueError(f"{path}: too short for a llama2.c header")
    if int(header[0]) == _LLAMA2C_MAGIC:
        raise ValueError(f"{path}: llama2.c version-1+ export format is not supported (use the legacy format)")
    return header


def _llama2c_config(path: Path) -> LlamaConfig:
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = (int(x) for x in _llama2c_header(path))
    return LlamaConfig(
        vocab_size=abs(vocab), hidden_size=dim, intermediate_size=hidden, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=dim // n_heads, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=vocab > 0, max_position_embeddings=seq_len,
        bos_token_id=1, eos_token_id=2,
    )


def load_llama2c(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    aux_hidden_layers: tuple[int, ...] | None = None,
    tp: TPGroup = SINGLE,
) -> LlamaForCausalLM:
    """A llama2.c legacy checkpoint: 7 int32 header + fp32 weights in run.c's order."""
    path = Path(path)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = (int(x) for x in _llama2c_header(path))
    shared = vocab > 0
    vocab = abs(vocab)
    d = dim // n_heads
    kv_dim = n_kv * d
    data = torch.from_numpy(np.fromfile(path, dtype=np.float32, offset=7 * 4).copy())
    offset = 0

    def take(*shape: int) -> torch.Tensor:
        nonlocal offset
        n = int(np.prod(shape))
        if offset + n > data.numel():
            raise ValueError(f"{path}: file ends early (header says dim={dim}, n_layers={n_layers}, vocab={vocab})")
        t = data[offset : offset + n].view(*shape)
        offset += n
        return t

    embed = take(vocab, dim)
    rms_att, wq, wk = take(n_layers, dim), take(n_layers, dim, dim), take(n_layers, kv_dim, dim)
    wv, wo = take(n_layers, kv_dim, dim), take(n_layers, dim, dim)
    rms_ffn, w1 = take(n_layers, dim), take(n_layers, hidden, dim)
    w2, w3 = take(n_layers, dim, hidden), take(n_layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len * d // 2)  # freq_cis_real (unused: RoPE is recomputed)
    take(seq_len * d // 2)  # freq_cis_imag
    wcls = None if shared else take(vocab, dim)
    if offset != data.numel():
        raise ValueError(f"{path}: {data.numel() - offset} trailing floats after the weights the header describes")
    config = _llama2c_config(path)
    state = {"model.embed_tokens.weight": embed, "model.norm.weight": rms_final}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": rms_att[i],
            p + "self_attn.q_proj.weight": unpermute_rope(wq[i], n_heads),
            p + "self_attn.k_proj.weight": unpermute_rope(wk[i], n_kv),
            p + "self_attn.v_proj.weight": wv[i],
            p + "self_attn.o_proj.weight": wo[i],
            p + "post_attention_layernorm.weight": rms_ffn[i],
            p + "mlp.gate_proj.weight": w1[i],
            p + "mlp.down_proj.weight": w2[i],
            p + "mlp.up_proj.weight": w3[i],
        })
    if wcls is not None:
        state["lm_head.weight"] = wcls
    return build_target(config, {k: v.contiguous() for k, v in state.items()}, what=f"llama2.c {path}",
                        dtype=dtype, device=device, aux_hidden_layers=aux_hidden_layers, tp=tp)


# ----------------------------------------------------------------------------- draft heads


def eagle3_aux_hidden_layers(draft_config: dict[str, Any], num_target_layers: int) -> tuple[int, ...]:
    """Target capture indices an EAGLE-3 head expects (LlamaForCausalLM's ``aux_hidden_layers``).

    ``eagle_config.eagle_aux_hidden_state_layer_ids`` name layer *outputs*; the target captures
    layer *inputs*, so each id becomes ``id + 1`` (as SGLang does). Without them: [2, L//2, L-3].
    """
    ids = (draft_config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return tuple(int(i) + 1 for i in ids)
    return default_eagle3_layers(num_target_layers)


def draft_aux_hidden_layers(path: str | Path, num_target_layers: int) -> tuple[int, ...] | None:
    """What ``aux_hidden_layers`` a target needs for the draft head at ``path`` (None for EAGLE-1)."""
    cfg = read_config(Path(path))
    if _draft_arch(cfg, None, Path(path)) != EAGLE3_ARCH:
        return None
    return eagle3_aux_hidden_layers(cfg, num_target_layers)


def _draft_arch(cfg: dict[str, Any], state: dict[str, torch.Tensor] | None, path: Path) -> str:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch in (EAGLE_ARCH, EAGLE3_ARCH):
        return arch
    if arch == "LlamaForCausalLM":
        # The EAGLE repository's own uploads say LlamaForCausalLM; tell them apart by their weights.
        names = set(state) if state is not None else set(weight_names(path))
        if any(n.startswith(("midlayer.", "model.midlayer.")) for n in names):
            return EAGLE3_ARCH
        if "fc.weight" in names or "model.fc.weight" in names:
            return EAGLE_ARCH
    raise ValueError(
        f"draft head {path}: architectures={archs!r} is not a supported draft head "
        f"(expected {EAGLE_ARCH} or {EAGLE3_ARCH})"
    )


def _check(path: Path, field: str, draft: Any, target: Any) -> None:
    if draft != target:
        raise ValueError(f"draft head {path}: {field}={draft} does not match the target's {field}={target}")


def load_draft_head(
    path: str | Path,
    target: LlamaForCausalLM,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    token_map: str | Path | None = None,
    load_format: str = "auto",
    seed: int = 0,
    draft_tp: str = "auto",
) -> DraftModel:
    """An EAGLE-1/2 or EAGLE-3 head from a checkpoint directory, sharing ``target``'s weights.

    ``token_map`` (EAGLE-1/2 only): a torch file holding the [draft_vocab] target ids the head
    may propose (SGLang's ``--speculative-token-map``); its lm_head keeps just those rows.
    ``load_format="dummy"``: only ``config.json`` is read; random weights from ``seed``, an EAGLE-3
    head's draft vocabulary being the first ``draft_vocab_size`` target ids.

    Under the target's tensor parallelism the head is sharded as the target is (its layers' heads
    and MLP, its lm_head over the draft vocabulary), or replicated whole on every rank, as
    ``draft_tp`` (--speculative-draft-tp: auto, shard, replicate; ``parallel.draft_head_group``)
    says; what stays whole (fc, norms, token maps; everything when replicated) is the same on every
    rank, dummy weights included (one seed for all ranks). The target's shared embedding and
    lm_head stay cut as the target's are either way.
    """
    check_load_format(load_format)
    path = Path(path)
    cfg = read_config(path)
    dummy = load_format == "dummy"
    state = {} if dummy else read_state_dict(path)
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    arch = _draft_arch(cfg, None if dummy else state, path)
    config = LlamaConfig.from_hf(cfg)
    if dummy and arch == EAGLE3_ARCH:
        state["d2t"] = torch.zeros(int(cfg.get("draft_vocab_size") or config.vocab_size), dtype=torch.int64)
    tc = target.config
    _check(path, "vocab_size", config.vocab_size, tc.vocab_size)
    target_hidden = int(cfg.get("target_hidden_size") or config.hidden_size) if arch == EAGLE3_ARCH else None
    if target_hidden is None or target_hidden == config.hidden_size:
        _check(path, "hidden_size", config.hidden_size, tc.hidden_size)
    else:
        _check(path, "target_hidden_size", target_hidden, tc.hidden_size)
    if config.hidden_size == tc.hidden_size:
        for field in ("num_attention_heads", "num_key_value_heads", "head_dim"):
            _check(path, field, getattr(config, field), getattr(tc, field))
    tp = draft_head_group(draft_tp, config, target.tp)  # the head's own weights' group
    own_embedding = "embed_tokens.weight" in state
    if not own_embedding and config.hidden_size != tc.hidden_size:
        raise ValueError(f"draft head {path}: hidden_size differs from the target's and it has no embed_tokens.weight")
    if arch == EAGLE_ARCH:
        state.pop("lm_head.weight", None)  # EAGLE-1 heads use the target's lm_head (as SGLang does)
        # An EAGLE-1 head reads the target's final hidden state, not captured layer inputs.
        _check(path, "aux_hidden_layers", None, target.aux_hidden_layers)
        hot = load_token_map(token_map, tc.vocab_size) if token_map is not None else None
        if hot is None:
            lm_head = target.lm_head_weight  # this rank's rows: the logits are gathered
        else:  # a token map's rows, whole on every rank
            full = target.lm_head_weight if target.tp.size == 1 else target.full_lm_head_weight()
            lm_head = full[hot.to(full.device)]
        with torch.device("meta"):
            model: DraftModel = EagleDraftModel(
                config, embed_tokens=target.embed_tokens, lm_head_weight=lm_head,
                own_embedding=own_embedding, fc_bias=True, dtype=dtype, device="meta",
                hot_token_ids=None if hot is None else hot.to(device),  # a real tensor: not in state
                tp=tp, target_tp=target.tp,
            )
    else:
        if token_map is not None:
            raise ValueError("--speculative-token-map applies to EAGLE heads; an EAGLE-3 head carries its own d2t map")
        model = _build_eagle3(path, cfg, config, state, target, own_embedding, dtype, tp)
    if dummy:
        state = random_state(model, seed=seed, dtype=dtype, device=device, given=state)
    else:
        state = shard_state_dict(state, config, tp)
    assign_weights(model, state, what=f"draft head {path}", dtype=dtype, device=device)
    return model.eval()


def load_token_map(path: str | Path, vocab_size: int) -> torch.Tensor:
    """[draft_vocab] int64 target ids from a token-map file (a saved tensor or list of ids)."""
    ids = torch.as_tensor(torch.load(Path(path), map_location="cpu", weights_only=True), dtype=torch.int64).flatten()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"--speculative-token-map {path}: ids must be a non-empty list in [0, {vocab_size})")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError(f"--speculative-token-map {path}: ids must be distinct")
    return ids


def _build_eagle3(
    path: Path, cfg: dict[str, Any], config: LlamaConfig, state: dict[str, torch.Tensor],
    target: LlamaForCausalLM, own_embedding: bool, dtype: torch.dtype, tp: TPGroup,
) -> Eagle3DraftModel:
    expected = eagle3_aux_hidden_layers(cfg, target.config.num_hidden_layers)
    _check(path, "aux_hidden_layers", expected, target.aux_hidden_layers)
    draft_vocab = int(cfg.get("draft_vocab_size") or config.vocab_size)
    shared_head = "lm_head.weight" not in state and draft_vocab == config.vocab_size
    if "d2t" not in state:
        if draft_vocab != config.vocab_size:
            raise ValueError(f"draft head {path}: draft_vocab_size={draft_vocab} < vocab_size but no d2t weight")
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)
    if "t2d" not in state:
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + state["d2t"].long()] = True
        state["t2d"] = t2d
    with torch.device("meta"):
        return Eagle3DraftModel(
            config, aux_hidden_layers=expected, embed_tokens=target.embed_tokens,
            draft_vocab_size=draft_vocab, target_hidden_size=cfg.get("target_hidden_size"),
            lm_head_weight=target.lm_head_weight if shared_head else None,
            own_embedding=own_embedding, fc_bias=bool(cfg.get("bias", False)), dtype=dtype, device="meta",
            tp=tp, target_tp=target.tp,
        )


def save_draft_head(model: DraftModel, path: str | Path) -> None:
    """Write ``config.json`` + ``model.safetensors`` in the format ``load_draft_head`` reads."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf()
    cfg["architectures"] = [model.architecture]
    if isinstance(model, Eagle3DraftModel):
        cfg["draft_vocab_size"] = model.draft_vocab_size
        cfg["bias"] = model.fc.bias is not None
        if model.target_hidden_size != model.config.hidden_size:
            cfg["target_hidden_size"] = model.target_hidden_size
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in model.aux_hidden_layers]}
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
