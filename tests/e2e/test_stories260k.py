"""Lossless on a real model: stories260K (llama2.c checkpoint shipped in the package)."""

import pytest
import torch

from specdec.engine.engine import Engine
from specdec.models.llama import default_eagle3_layers
from specdec.models.loaders import load_target
from ..builders import make_random_eagle3_head, make_random_eagle_head
from specdec.models.tokenizer import load_tokenizer
from specdec.engine.embedded import DEFAULT_MODEL

from .helpers import assert_no_leak

PROMPTS = ["Once upon a time, there was a little dog.", "Lily and Ben went to the park.", "The sun"]


@pytest.mark.parametrize("algorithm, shape, page_size", [
    ("EAGLE", (3, 1, 4), 1), ("EAGLE", (5, 4, 8), 16), ("EAGLE3", (4, 8, 32), 1), ("EAGLE3", (6, 10, 60), 16),
])
def test_stories260k_greedy_speculative_equals_plain(algorithm, shape, page_size):
    aux = default_eagle3_layers(5) if algorithm == "EAGLE3" else None
    target = load_target(DEFAULT_MODEL, dtype=torch.float32, device="cpu", aux_hidden_layers=aux)
    tok = load_tokenizer(DEFAULT_MODEL)
    head = make_random_eagle3_head(target, 1) if aux else make_random_eagle_head(target, 1)
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    plain = Engine(target_model=target, tokenizer=tok, page_size=page_size, max_total_tokens=4096)
    expected = plain.generate(PROMPTS, params)
    steps, topk, ntok = shape
    spec = Engine(target_model=target, draft_model=head, tokenizer=tok, page_size=page_size, max_total_tokens=4096,
                  speculative_algorithm=algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                  speculative_num_draft_tokens=ntok)
    got = spec.generate(PROMPTS, params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert [g["text"] for g in got] == [e["text"] for e in expected]
    assert "Lily" in expected[0]["text"] or len(expected[0]["text"].split()) > 10  # real English came out
    assert_no_leak(spec)
