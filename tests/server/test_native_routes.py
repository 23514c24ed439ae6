"""SGLang's informational and probe routes: /health_generate runs one token through the engine,
/get_server_info reports the engine's arguments (SGLang's flag names) and its KV pool."""

from __future__ import annotations

import httpx

from specdec import __version__

from ..e2e.helpers import engine, make_pair
from .live import LiveServer, kv_is_free


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
