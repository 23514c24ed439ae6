"""SGLang's informational and probe routes: /health_generate runs one token through the engine,
/get_server_info reports the engine's arguments (SGLang's flag names) and its KV pool."""

from __future__ import annotations

import httpx

from specdec import __version__

from ..e2e.helpers import engine, make_pair
from .live import CharTokenizer, LiveServer, kv_is_free


def test_health_generate_and_server_info():
    target, draft = make_pair("EAGLE", "mixed", seed=8)
    eng = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), page_size=4)
    with LiveServer(eng) as live:
        before = live.engine_state(lambda e: e.scheduler.prefill_tokens)
        deep = httpx.get(f"{live.url}/health_generate", timeout=60)
        assert deep.status_code == 200 and deep.json() == {"status": "ok"}
        assert live.engine_state(lambda e: e.scheduler.prefill_tokens) == before + 1  # it really ran
        info = httpx.get(f"{live.url}/get_server_info", timeout=60).json()
        assert info["speculative_algorithm"] == "EAGLE" and info["speculative_num_steps"] == 3
        assert info["page_size"] == 4 and info["max_total_tokens"] == eng.memory.capacity
        assert info["version"] == __version__ and info["served_model_name"] == "tiny"
        assert isinstance(info["dtype"], str)  # JSON whatever the engine was given (a torch.dtype in code)
        live.wait_idle()
        assert live.engine_state(kv_is_free)


def test_tokenize_and_detokenize_round_trip():
    target, _ = make_pair("EAGLE", "random", seed=9)
    tok = CharTokenizer()
    with LiveServer(engine(target, tokenizer=tok)) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        for path in ("/tokenize", "/v1/tokenize"):
            one = client.post(path, json={"prompt": "Hi there"}).json()
            assert one == {"tokens": tok.encode("Hi there"), "count": 9, "max_model_len": 512}
        two = client.post("/tokenize", json={"prompt": ["ab", "c"], "add_special_tokens": False}).json()
        assert two["tokens"] == [tok.encode("ab", add_bos=False), tok.encode("c", add_bos=False)]
        assert two["count"] == [2, 1]
        for path in ("/detokenize", "/v1/detokenize"):
            assert client.post(path, json={"tokens": one["tokens"]}).json() == {"text": "Hi there"}
        assert client.post("/detokenize", json={"tokens": two["tokens"]}).json() == {"text": ["ab", "c"]}
        bad = client.post("/detokenize", json={"tokens": [3, 97]})
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("tokens:")
        # text the tokenizer cannot encode: 400 naming it (the server tokenizes, not the engine), nothing lost
        for path, body in (("/generate", {"text": "naïve"}), ("/v1/completions", {"prompt": "naïve"}),
                           ("/tokenize", {"prompt": "naïve"})):
            r = client.post(path, json=body)
            assert r.status_code == 400 and "outside the test alphabet" in r.json()["error"]["message"], r.text
        ok = client.post("/generate", json={"text": "naive", "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2
    with LiveServer(engine(target)) as bare:  # no tokenizer
        r = httpx.post(f"{bare.url}/tokenize", json={"prompt": "x"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"] == "prompt: this model has no tokenizer"
