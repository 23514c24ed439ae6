"""The llama2.c loader on the real stories260K, against a numpy port of llama2.c's run.c forward.

The reference reads the file itself and uses llama2.c's interleaved-pair RoPE on the unpermuted
wq/wk, so agreement proves the loader's rotate_half permutation.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.forward import LogitsMode
from specdec.models import load_target, load_tokenizer, read_num_layers
from ..builders import StandaloneRunner, greedy_generate_reference

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
BIN = SHARED / "models" / "stories260K" / "stories260K.bin"
pytestmark = pytest.mark.skipif(not BIN.is_file(), reason=f"{BIN} not present")


def run_c_forward(path: Path, tokens: list[int]) -> np.ndarray:
    """llama2.c run.c, position by position with a KV cache, in float64. Returns [T, vocab] logits."""
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = np.fromfile(path, np.int32, 7).tolist()
    w = np.fromfile(path, np.float32, offset=28).astype(np.float64)
    hs = dim // n_heads
    kv_dim = n_kv * hs
    sizes = [("emb", abs(vocab) * dim), ("rms_att", n_layers * dim), ("wq", n_layers * dim * dim),
             ("wk", n_layers * dim * kv_dim), ("wv", n_layers * dim * kv_dim), ("wo", n_layers * dim * dim),
             ("rms_ffn", n_layers * dim), ("w1", n_layers * dim * hidden), ("w2", n_layers * hidden * dim),
             ("w3", n_layers * dim * hidden), ("rms_final", dim)]
    p, W = 0, {}
    for name, n in sizes:
        W[name], p = w[p : p + n], p + n
    vocab = abs(vocab)
    emb = W["emb"].reshape(vocab, dim)
    L = lambda name, *shape: W[name].reshape(n_layers, *shape)  # noqa: E731
    wq, wk, wv, wo = L("wq", dim, dim), L("wk", kv_dim, dim), L("wv", kv_dim, dim), L("wo", dim, dim)
    w1, w2, w3 = L("w1", hidden, dim), L("w2", dim, hidden), L("w3", hidden, dim)
    rms_att, rms_ffn = L("rms_att", dim), L("rms_ffn", dim)

    def rmsnorm(x, weight):
        return weight * x / np.sqrt(np.mean(x * x) + 1e-5)

    kcache = np.zeros((n_layers, len(tokens), kv_dim))
    vcache = np.zeros((n_layers, len(tokens), kv_dim))
    out = []
    for pos, tok in enumerate(tokens):
        x = emb[tok].copy()
        for l in range(n_layers):
            xb = rmsnorm(x, rms_att[l])
            q, k, v = wq[l] @ xb, wk[l] @ xb, wv[l] @ xb
            for i in range(0, dim, 2):  # interleaved pairs, as in run.c
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                fcr, fci = np.cos(pos * freq), np.sin(pos * freq)
                for vec in ((q, k) if i < kv_dim else (q,)):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            kcache[l, pos], vcache[l, pos] = k, v
            att_out = np.zeros(dim)
            for h in range(n_heads):
                kvh = h // (n_heads // n_kv)
                qh = q[h * hs : (h + 1) * hs]
                ks = kcache[l, : pos + 1, kvh * hs : (kvh + 1) * hs]
                s = ks @ qh / np.sqrt(hs)
                a = np.exp(s - s.max())
                a /= a.sum()
                att_out[h * hs : (h + 1) * hs] = a @ vcache[l, : pos + 1, kvh * hs : (kvh + 1) * hs]
            x = x + wo[l] @ att_out
            xb = rmsnorm(x, rms_ffn[l])
            g = w1[l] @ xb
            x = x + w2[l] @ ((g / (1 + np.exp(-g))) * (w3[l] @ xb))
        x = rmsnorm(x, W["rms_final"])
        out.append(emb @ x)  # shared classifier (vocab > 0 in the header)
    return np.stack(out)


def test_logits_match_llama2c_run_c():
    model = load_target(BIN)
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 4
    assert read_num_layers(BIN) == 5
    tokens = [1, 403, 407, 261, 378, 11, 300, 150, 77, 421, 5, 260, 499, 32, 18, 290]
    ref = run_c_forward(BIN, tokens)
    ours = StandaloneRunner(model, 32).forward(tokens).next_token_logits
    np.testing.assert_allclose(ours.double().numpy(), ref, atol=2e-4, rtol=1e-4)


def test_greedy_continuation_is_english():
    model = load_target(BIN)
    tok = load_tokenizer(BIN)
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 512)
    prompt = tok.encode("Once upon a time")
    assert prompt[0] == 1 and tok.decode(prompt) == "Once upon a time"
    new = greedy_generate_reference(model, prompt, 40)
    text = tok.decode(prompt + new)
    words = text.replace(",", " ").replace(".", " ").split()
    assert text.startswith("Once upon a time")
    assert len(words) >= 15 and {"a", "was", "the"} & {w.lower() for w in words}
    assert sum(w.isalpha() for w in words) >= 0.9 * len(words), text
    # LAST logits of a prefill equal the last row of ALL logits
    runner = StandaloneRunner(model, 16)
    last = runner.forward(prompt, logits_mode=LogitsMode.LAST).next_token_logits
    full = StandaloneRunner(model, 16).forward(prompt).next_token_logits
    torch.testing.assert_close(last, full[-1:])
