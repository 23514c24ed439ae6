"""PiecewiseGraphRunner on CPU: the padded path run eagerly (``use_graphs=False``), with a toy body of
two "layers" whose attention mixes rows (so a padding row reaching a real one would show)."""

import pytest
import torch

from specdec.cuda_graph.piecewise import PiecewiseGraphRunner, default_token_counts

H = 8


def _weights(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(16, H, generator=gen), [torch.randn(H, 3 * H, generator=gen) for _ in range(2)]


def _body(embed, layers):
    def body(input_ids, positions, attention):
        x = embed[input_ids] + positions[:, None].float()  # [T, H]
        for i, w in enumerate(layers):
            q, k, v = (x @ w).split(H, dim=-1)
            x = x + attention.forward(q * 1.0, k * 1.0, v * 1.0, i, None)  # row-wise ops around it
        return x.tanh(), (x * 2 if len(layers) else None)

    return body


class _Causal:
    """Causal softmax attention over the rows it is given (the real ones only, in the piecewise path)."""

    def forward(self, q, k, v, layer, batch):
        t = q.shape[0]
        scores = (q @ k.T).masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        return torch.softmax(scores, -1) @ v


def test_default_token_counts():
    assert default_token_counts(8192) == [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                                          3072, 4096, 6144, 8192]
    assert default_token_counts(100) == [8, 16, 24, 32, 48, 64, 96, 100]
    assert default_token_counts(5) == [5]
    with pytest.raises(ValueError, match="--piecewise-cuda-graph-max-tokens=0"):
        default_token_counts(0)


def test_padded_path_equals_the_body_over_the_real_rows():
    embed, layers = _weights()
    body, attention = _body(embed, layers), _Causal()
    runner = PiecewiseGraphRunner(body, [4, 16], device="cpu")
    runner.capture()  # no-op on CPU
    gen = torch.Generator().manual_seed(1)
    for tokens in (16, 3, 11, 4, 1):  # padded to 16, 4, 16, 4, 4: stale rows from the calls before
        ids, pos = torch.randint(0, 16, (tokens,), generator=gen), torch.arange(tokens)
        normed, hidden = runner(ids, pos, lambda q, k, v, layer: attention.forward(q, k, v, layer, None))
        want_normed, want_hidden = body(ids, pos, attention)
        assert normed.shape == (tokens, H) and hidden.shape == (tokens, H)
        torch.testing.assert_close(normed, want_normed)
        torch.testing.assert_close(hidden, want_hidden)
    assert runner.num_calls == 5 and runner.padded_count(5) == 16


def test_calls_outside_the_captured_counts_are_refused():
    embed, layers = _weights()
    runner = PiecewiseGraphRunner(_body(embed, layers), [8], device="cpu")
    assert not runner.can_run(0) and runner.can_run(8) and not runner.can_run(9)
    with pytest.raises(ValueError, match="cannot run 9 tokens"):
        runner(torch.zeros(9, dtype=torch.int64), torch.arange(9), lambda *a: None)
    with pytest.raises(ValueError, match="token counts must be non-empty"):
        PiecewiseGraphRunner(_body(embed, layers), [], device="cpu")
