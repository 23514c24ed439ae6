"""Instruction prompts for chat targets: the committed prompt file is disjoint from evaluation,
chat rendering, and ``specdec train-draft``'s regenerate-only and half-precision export paths."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec.engine.chat import has_chat_template, render_user_prompt
from specdec.train.data import _from_file, near_duplicates, overlapping_prompts, screen_prompts, write_prompt_file

DATA = Path(__file__).resolve().parents[2] / "specdec" / "data"
SMOLLM2_PROMPTS = DATA / "train_prompts" / "smollm2.jsonl.gz"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _first_lines(path: Path, n: int) -> str:
    return "".join(line + "\n" for line in gzip.decompress(path.read_bytes()).decode().splitlines()[:n])


class _Tok:
    def __init__(self, chat_template=None):
        self.chat_template = chat_template


def test_render_user_prompt_uses_the_template():
    assert render_user_prompt(_Tok(CHATML), "Name a colour.") == (
        "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n")
    assert render_user_prompt(_Tok(), "Once upon a time") == "Once upon a time"
    assert has_chat_template(_Tok(CHATML)) and not has_chat_template(_Tok(""))


def test_near_duplicates_worked_example():
    evals = ["Given that f(x) = 4x^3 - 9x - 14, find the value of f(2)."]
    texts = ["Given that f(x) = 5x^3 - 2x + 3, find the value of f(2).",  # same question, other numbers
             "What are the differences between plant-based and animal-based protein sources?"]
    assert near_duplicates(texts, evals) == [0]


def test_committed_smollm2_prompts_are_disjoint_from_evaluation():
    samples = _from_file(SMOLLM2_PROMPTS)
    assert len(samples) == 2554
    assert {s.source for s in samples} == {"alpaca_eval", "alpaca", "spec_bench", "gsm8k"}
    assert all(s.prompt.strip() and not s.response for s in samples)
    banned = screen_prompts()  # the benchmark's prompt files, plus the shared evaluation sets when present
    prompts = [s.prompt for s in samples]
    assert overlapping_prompts(prompts, banned) == []
    # instruction sets are also free of near-duplicates (GSM8K's official train split is disjoint from
    # its test split by construction; short word problems there share words by chance)
    instructions = [s.prompt for s in samples if s.source != "gsm8k"]
    assert near_duplicates(instructions, banned) == []


def test_prompt_file_gzipped_round_trip(tmp_path):
    """A prompt file written as .jsonl.gz holds the .jsonl's bytes and reads back to the same samples."""
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps({"prompt": p, "source": "ours"}) + "\n" for p in (
        "Describe a lighthouse keeper's morning in four sentences.", "List three uses of a paperclip.")))
    plain = write_prompt_file(tmp_path / "p.jsonl", [str(source)])
    packed = write_prompt_file(tmp_path / "p.jsonl.gz", [str(source)])
    assert plain == packed and len(plain) == 2
    assert gzip.decompress((tmp_path / "p.jsonl.gz").read_bytes()) == (tmp_path / "p.jsonl").read_bytes()
    assert _from_file(tmp_path / "p.jsonl.gz") == _from_file(tmp_path / "p.jsonl") == plain


def test_cli_regen_only_then_fp16_export(tmp_path, capsys):
    """stories260K (no chat template): --regen-only fills the cache and stops; the second run reuses
    it, trains, and writes float16 weights that load back."""
    from specdec.models.loaders import load_draft_head, load_target
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.cli.train import train_draft_main as main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_first_lines(SMOLLM2_PROMPTS, 6))
    common = ["--model-path", DEFAULT_MODEL, "--dataset", str(prompts),
              "--algorithm", "EAGLE", "--output-dir", str(tmp_path / "head"), "--work-dir", str(tmp_path / "work"),
              "--max-len", "24", "--regen-max-new-tokens", "4", "--regen-temperatures", "0", "--batch-size", "4",
              "--epochs", "1", "--no-human-text", "--regen-batch-size", "3", "--save-dtype", "float16"]
    main(common + ["--regen-only"])
    assert len(list((tmp_path / "work").glob("regen-*.pt"))) == 1
    assert not (tmp_path / "head" / "model.safetensors").exists()
    main(common)
    assert "regenerate: reusing 6 sequences" in capsys.readouterr().out
    state = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert {t.dtype for t in state.values()} == {torch.float16}
    summary = json.loads((tmp_path / "head" / "training.json").read_text())
    assert summary["save_dtype"] == "float16" and summary["chat_template"] is False
    head = load_draft_head(tmp_path / "head", load_target(DEFAULT_MODEL))
    assert head.fc.weight.dtype == torch.float32


@pytest.mark.parametrize("bad", [["--dtype", "float64"], ["--chat-template", "yes"]])
def test_cli_rejects_bad_choices(bad):
    from specdec.cli.train import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--output-dir", "x", *bad])


def test_cli_init_from_keeps_the_heads_draft_vocab(tmp_path, capsys):
    """--init-from: an EAGLE-3 head exported with a 64-id draft vocab continues training with that
    vocab (not the 32 ids --draft-vocab-size asks for), starting from its exported weights."""
    from specdec.models.loaders import load_draft_head, load_target
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.cli.train import train_draft_main as main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_first_lines(SMOLLM2_PROMPTS, 4))
    common = ["--model-path", DEFAULT_MODEL, "--dataset", str(prompts), "--algorithm", "EAGLE3",
              "--work-dir", str(tmp_path / "work"), "--max-len", "24", "--regen-max-new-tokens", "4",
              "--regen-temperatures", "0", "--batch-size", "4", "--no-human-text", "--regen-batch-size", "4"]
    main(common + ["--output-dir", str(tmp_path / "first"), "--draft-vocab-size", "64", "--max-steps", "2"])
    main(common + ["--output-dir", str(tmp_path / "second"), "--draft-vocab-size", "32", "--max-steps", "1",
                   "--init-from", str(tmp_path / "first"), "--lr", "1e-9"])
    summary = json.loads((tmp_path / "second" / "training.json").read_text())
    assert summary["draft_vocab_size"] == 64 and summary["init_from"] == str(tmp_path / "first")
    target = load_target(DEFAULT_MODEL, aux_hidden_layers=tuple(summary["aux_hidden_layers"]))
    first, second = (load_draft_head(tmp_path / d, target) for d in ("first", "second"))
    assert torch.equal(first.d2t, second.d2t)
    for name, tensor in first.state_dict().items():  # lr 1e-9: one step moves nothing visibly
        torch.testing.assert_close(second.state_dict()[name], tensor, rtol=0, atol=1e-6)


def test_committed_magpie_prompts_are_clean_and_disjoint_from_evaluation():
    """The instructions SmolLM2 wrote itself for its heads (scripts/train_smollm2.sh, run on the H100)."""
    samples = _from_file(DATA / "train_prompts" / "smollm2_magpie.jsonl.gz")
    assert len(samples) == 10062 and {s.source for s in samples} == {"magpie"}
    prompts = [s.prompt for s in samples]
    assert all(p == p.strip() and len(p.split()) >= 3 and "<|" not in p for p in prompts)
    assert len({" ".join(p.lower().split()) for p in prompts}) == len(prompts)
    banned = screen_prompts()
    assert overlapping_prompts(prompts, banned) == []
    assert near_duplicates(prompts, banned) == []
