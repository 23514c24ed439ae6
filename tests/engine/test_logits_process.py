"""Logits processors and grammar masks at every node of a draft tree, against per-path references.

The tree of every test here (node index: token), root = the last committed token:

        0: 7
       /    \\
     1: 5   2: 9
      |
     3: 5

Node 3's path is root -> 1 -> 3: its processors see output + [5, 5] (token 5 counted twice);
node 2's path is root -> 2: output + [9].
"""

from types import SimpleNamespace

import pytest
import torch

from specdec.engine.logits_process import ProcessorBatch, apply_processors, path_counts
from specdec.engine.sampling import SamplingParams

VOCAB = 13
TOKENS = [7, 5, 9, 5]
PARENT = [-1, 0, 0, 1]
# retrive_next_token / retrive_next_sibling of the drawn tree (local indices, -1 for none)
NEXT_TOKEN = [1, 3, -1, -1]
NEXT_SIBLING = [-1, 2, -1, -1]


def path_of(t: int) -> list[int]:
    """Nodes root -> t, root excluded."""
    nodes = []
    while t > 0:
        nodes.append(t)
        t = PARENT[t]
    return nodes[::-1]


def ancestors() -> torch.Tensor:  # [1, N, N] bool, QLEN_ONLY tree mask of the drawn tree
    n = len(TOKENS)
    mask = torch.zeros(1, n, n, dtype=torch.bool)
    for t in range(n):
        for s in [0, *path_of(t)]:
            mask[0, t, s] = True
    return mask


def request(**params):
    return SimpleNamespace(params=SamplingParams(**params), prompt_ids=[3, 4, 3], output_ids=[9, 1, 9], stop_ids=[2])


def reference_row(logits: torch.Tensor, req, path_tokens: list[int]) -> torch.Tensor:  # [V]
    """Plain decoding's processed logits after committing ``path_tokens``: a loop over the vocab."""
    p, out = req.params, logits.clone()
    output = req.output_ids + path_tokens
    bias = dict(p.logit_bias or ())
    for v in range(VOCAB):
        count = output.count(v)
        x = out[v] - p.presence_penalty * (count > 0) - p.frequency_penalty * count
        if count > 0 or v in req.prompt_ids:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        x = x + bias.get(v, 0.0)
        if len(output) < p.min_new_tokens and v in req.stop_ids:
            x = float("-inf")
        out[v] = x
    return out


def test_path_counts_of_the_drawn_tree():
    counts = path_counts(torch.tensor([TOKENS]), ancestors(), VOCAB)[0]  # [N, V]
    expected = torch.zeros(len(TOKENS), VOCAB)
    expected[1, 5] = 1
    expected[2, 9] = 1
    expected[3, 5] = 2  # token 5 at nodes 1 and 3
    assert torch.equal(counts, expected)


@pytest.mark.parametrize("params", [
    {"presence_penalty": 1.0, "frequency_penalty": 0.5},
    {"frequency_penalty": -0.7, "repetition_penalty": 1.3},
    {"repetition_penalty": 0.6, "logit_bias": {"5": -3.0, "11": 4.5}},
    {"min_new_tokens": 5, "presence_penalty": 0.25},  # 3 outputs: stop banned at depth 0 and 1 only
])
def test_every_node_sees_its_own_path(params):
    req = request(**params)
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(len(TOKENS), VOCAB, generator=gen) * 3  # [N, V] fresh, signs mixed
    batch = ProcessorBatch.build([req], VOCAB, "cpu")
    got = apply_processors(logits, batch, candidates=torch.tensor([TOKENS]), ancestors=ancestors())
    for t in range(len(TOKENS)):
        expected = reference_row(logits[t], req, [TOKENS[s] for s in path_of(t)])
        torch.testing.assert_close(got[t], expected, rtol=0, atol=1e-6)


def test_root_only_equals_plain_decoding():
    req = request(presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.1, logit_bias={"0": 1.0})
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(5))
    got = apply_processors(logits, ProcessorBatch.build([req], VOCAB, "cpu"))
    torch.testing.assert_close(got[0], reference_row(logits[0], req, []), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------- grammar masks
@pytest.fixture(scope="module")
def digits_grammar():
    pytest.importorskip("xgrammar")
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.engine.grammar import GrammarBackend
    from specdec.models.tokenizer import load_tokenizer

    tok = load_tokenizer(DEFAULT_MODEL)
    backend = GrammarBackend(tok, tok.vocab_size, [tok.eos_token_id])
    one, two = tok.encode("1", add_bos=False)[-1], tok.encode("12", add_bos=False)[-1]
    letter = tok.encode("a", add_bos=False)[-1]
    return backend, tok, (one, two, letter)


def test_grammar_mask_of_each_node_follows_its_own_path(digits_grammar):
    """Regex 1[0-9]*; tree root -> '1' -> '2' and root -> 'a' (rejected: its row allows nothing).

        0: root
       /      \\
     1: '1'   2: 'a'
      |
     3: '2'
    """
    backend, tok, (one, two, letter) = digits_grammar
    tokens = [tok.bos_token_id, one, letter, two]
    grammar = backend.matcher("regex", "1[0-9]*")
    rows = grammar.tree_mask(torch.tensor(tokens), torch.tensor(NEXT_TOKEN), torch.tensor(NEXT_SIBLING))  # [N, V]
    for t in range(len(tokens)):
        fresh = backend.matcher("regex", "1[0-9]*")
        if all(fresh.accept(tokens[s]) for s in path_of(t)):
            expected = fresh.tree_mask(torch.tensor([0]), torch.tensor([-1]), torch.tensor([-1]))[0]
        else:
            expected = torch.zeros(tok.vocab_size, dtype=torch.bool)
        assert torch.equal(rows[t], expected), t
    assert rows[0, one] and not rows[0, two] and not rows[0, tok.eos_token_id]  # must start with 1
    assert rows[1, two] and rows[1, tok.eos_token_id]  # "1" may end or go on
    assert not rows[2].any()  # "a" left the grammar
    assert not grammar.terminated  # the tree walk rolled the matcher back
