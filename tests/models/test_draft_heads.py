"""EAGLE / EAGLE-3 draft heads: checkpoint round trip, mismatch errors, and the perfect-draft fixture."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.forward import CaptureHiddenMode, LogitsMode
from specdec.models import (
    Eagle3DraftModel,
    EagleDraftModel,
    draft_aux_hidden_layers,
    load_draft_head,
    save_draft_head,
)
from ..builders import (
    StandaloneRunner,
    make_perfect_draft_pair,
    make_random_eagle3_head,
    make_random_eagle_head,
    make_random_target,
    tiny_llama_config,
)

FULL = CaptureHiddenMode.FULL


def _ids(n, vocab=97, seed=0):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _draft_outputs(target, draft, ids, steps=3):
    """Target prefill (capturing), draft extend over the shifted prompt, then own-hidden draft steps."""
    t_out = StandaloneRunner(target, 64).forward(ids, capture_hidden_mode=FULL)
    runner = StandaloneRunner(draft, 64)
    nxt = int(t_out.next_token_logits[-1].argmax())
    out = runner.forward(ids[1:] + [nxt], spec_hidden_states=t_out.hidden_states, capture_hidden_mode=FULL)
    logits, hidden = [out.next_token_logits], out.hidden_states
    for _ in range(steps):
        tok = int(logits[-1][-1].argmax())
        if isinstance(draft, Eagle3DraftModel):
            tok = int(draft.map_draft_to_target(torch.tensor(tok)))
        out = runner.forward([tok], spec_hidden_states=hidden[-1:], logits_mode=LogitsMode.LAST,
                             capture_hidden_mode=CaptureHiddenMode.LAST)
        logits.append(out.next_token_logits)
        hidden = out.hidden_states
    return torch.cat(logits)


def _pair(kind, **cfg):
    if kind == "EAGLE":
        target = make_random_target(tiny_llama_config(**cfg), seed=1)
        return target, make_random_eagle_head(target, seed=2)
    target = make_random_target(tiny_llama_config(**cfg), seed=1, aux_hidden_layers=(0, 2, 4))
    return target, make_random_eagle3_head(target, seed=2, draft_vocab_size=50)


@pytest.mark.parametrize("kind", ["EAGLE", "EAGLE3"])
def test_round_trip_gives_identical_outputs(kind, tmp_path):
    target, head = _pair(kind)
    save_draft_head(head, tmp_path)
    loaded = load_draft_head(tmp_path, target)
    assert type(loaded) is type(head)
    assert loaded.lm_head_weight.shape == head.lm_head_weight.shape
    ids = _ids(15)
    torch.testing.assert_close(_draft_outputs(target, loaded, ids), _draft_outputs(target, head, ids), rtol=0, atol=0)
    if kind == "EAGLE3":
        assert loaded.draft_vocab_size == 50 and loaded.aux_hidden_layers == (0, 2, 4)
        assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
        mapped = loaded.map_draft_to_target(torch.arange(50))
        assert torch.equal(loaded.t2d.nonzero().view(-1), mapped)
        assert draft_aux_hidden_layers(tmp_path, 4) == (0, 2, 4)
        assert json.loads((tmp_path / "config.json").read_text())["eagle_config"] == {
            "eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}
    else:
        assert draft_aux_hidden_layers(tmp_path, 4) is None
        assert loaded.embedding is target.embed_tokens  # shared, not copied


def test_eagle_repo_layout_pytorch_bin_with_own_embedding(tmp_path):
    """EAGLE repository uploads: architectures LlamaForCausalLM, pytorch_model.bin, embed_tokens inside."""
    target, head = _pair("EAGLE")
    save_draft_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone() * 2
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_draft_head(tmp_path, target)
    assert isinstance(loaded, EagleDraftModel) and loaded.embedding is not target.embed_tokens
    torch.testing.assert_close(loaded.embedding.weight, state["embed_tokens.weight"])


@pytest.mark.parametrize("kind", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("field,other", [("hidden_size", dict(hidden_size=32)), ("vocab_size", dict(vocab_size=101)),
                                         ("num_key_value_heads", dict(num_key_value_heads=4))])
def test_mismatch_with_target_names_the_field(kind, field, other, tmp_path):
    _, head = _pair(kind)
    save_draft_head(head, tmp_path)
    wrong, _ = _pair(kind, **other)
    with pytest.raises(ValueError, match=field):
        load_draft_head(tmp_path, wrong)


def test_eagle3_capture_layers_must_match(tmp_path):
    target, head = _pair("EAGLE3")
    save_draft_head(head, tmp_path)
    other = make_random_target(tiny_llama_config(), seed=1, aux_hidden_layers=(2, 2, 1))
    with pytest.raises(ValueError, match="aux_hidden_layers"):
        load_draft_head(tmp_path, other)
    plain = make_random_target(tiny_llama_config(), seed=1)
    with pytest.raises(ValueError, match="aux_hidden_layers"):
        load_draft_head(tmp_path, plain)


def test_bad_checkpoints_raise(tmp_path):
    target, head = _pair("EAGLE")
    save_draft_head(head, tmp_path)
    cfg_file, weights = tmp_path / "config.json", tmp_path / "model.safetensors"
    cfg, state = json.loads(cfg_file.read_text()), load_file(str(weights))
    cfg_file.write_text(json.dumps({**cfg, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ValueError, match="architectures"):
        load_draft_head(tmp_path, target)
    cfg_file.write_text(json.dumps(cfg))
    save_file({k: v for k, v in state.items() if k != "fc.bias"}, str(weights))
    with pytest.raises(ValueError, match="missing weights.*fc.bias"):
        load_draft_head(tmp_path, target)
    save_file({**state, "layers.0.extra.weight": torch.zeros(3)}, str(weights))
    with pytest.raises(ValueError, match="unexpected weights.*extra"):
        load_draft_head(tmp_path, target)
    save_file({**state, "fc.bias": torch.zeros(5)}, str(weights))
    with pytest.raises(ValueError, match="fc.bias has shape"):
        load_draft_head(tmp_path, target)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("cfg", [{}, dict(num_key_value_heads=1), dict(num_hidden_layers=6)])
def test_perfect_draft_predicts_target_next_token(algorithm, cfg):
    target, draft = make_perfect_draft_pair(tiny_llama_config(**cfg), algorithm)
    vocab = target.config.vocab_size
    every_id = torch.randperm(vocab, generator=torch.Generator().manual_seed(0)).tolist()
    # the target's next token depends only on the current one: f[x] for every token id
    f_rows = StandaloneRunner(target, 128).forward(every_id).next_token_logits.argmax(-1)
    f = torch.empty(vocab, dtype=torch.int64)
    f[torch.tensor(every_id)] = f_rows
    assert len(set(f.tolist())) > vocab // 4  # not a degenerate table
    ids = _ids(10, vocab, 3) + every_id
    t_out = StandaloneRunner(target, 160).forward(ids, capture_hidden_mode=FULL)
    assert torch.equal(t_out.next_token_logits.argmax(-1), f[torch.tensor(ids)])
    # draft extend over the prompt shifted by one: row i sees token ids[i+1] and target hidden i
    shifted = ids[1:] + [int(f[ids[-1]])]
    runner = StandaloneRunner(draft, 200)
    out = runner.forward(shifted, spec_hidden_states=t_out.hidden_states, capture_hidden_mode=FULL)
    assert torch.equal(out.next_token_logits.argmax(-1), f[torch.tensor(shifted)])
    # chained draft steps on the head's own hidden state
    tok, hidden = int(out.next_token_logits[-1].argmax()), out.hidden_states[-1:]
    for _ in range(8):
        step = runner.forward([tok], spec_hidden_states=hidden, logits_mode=LogitsMode.LAST,
                              capture_hidden_mode=CaptureHiddenMode.LAST)
        pred = int(step.next_token_logits[0].argmax())
        assert pred == int(f[tok])
        tok, hidden = pred, step.hidden_states
