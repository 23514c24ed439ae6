"""The OpenAPI document tells the truth: schemathesis (``--checks all``) against a live server with
a real model, tokenizer and EAGLE head; plus the document's declarations themselves."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from specdec.engine.engine import Engine
from specdec.engine.embedded import DEFAULT_DRAFT, DEFAULT_MODEL
from specdec.server.openapi import range_regex

from .live import LiveServer

CONTEXT = 128
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def live():
    eng = Engine(DEFAULT_MODEL, speculative_algorithm="EAGLE", speculative_draft_model_path=DEFAULT_DRAFT,
                 speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=4,
                 context_length=CONTEXT, max_total_tokens=8192, dtype=torch.float32)
    with LiveServer(eng, model_name="stories260K") as server:
        yield server


def test_document_declares_models_errors_and_limits(live):
    doc = httpx.get(f"{live.url}/openapi.json").json()
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        op = doc["paths"][path]["post"]
        assert "$ref" in op["requestBody"]["content"]["application/json"]["schema"]
        assert {"200", "400", "500", "503"} <= set(op["responses"]) and "422" not in op["responses"]
        assert "text/event-stream" in op["responses"]["200"]["content"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert schemas["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == CONTEXT
    r = httpx.put(f"{live.url}/generate")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and "message" in r.json()["error"]


@pytest.mark.parametrize("hi", [0, 5, 9, 10, 96, 100, 511, 49151])
def test_range_regex_matches_exactly_0_to_hi(hi):
    import re

    pattern = re.compile(f"^({range_regex(hi)})$")
    assert all(pattern.match(str(i)) for i in range(hi + 1))
    assert not any(pattern.match(s) for s in (str(hi + 1), str(hi + 10), "01", "-1", ""))


SCHEMATHESIS = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
needs_schemathesis = pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is not installed (the test extra)")


def _schemathesis(url: str, tmp_path: Path, *phase_args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([SCHEMATHESIS, "run", f"{url}/openapi.json", "--checks", "all", "--seed", "1",
                           "--no-shrink", "--request-timeout", "60", "--workers", "1", *phase_args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


@needs_schemathesis
def test_schemathesis_all_checks_pass(live, tmp_path, monkeypatch):
    """The CI run, bounded (about 20 s on 2 cores): the examples and fuzzing phases, 30 examples per
    route, a fixed seed; every check."""
    monkeypatch.setenv("SPECDEC_TORCH_PROFILER_DIR", str(tmp_path / "profiles"))  # /start_profile's default
    run = _schemathesis(live.url, tmp_path, "--phases", "examples,fuzzing", "--max-examples", "30")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


@needs_schemathesis
@pytest.mark.skipif(not os.environ.get("SPECDEC_SCHEMATHESIS_COVERAGE"),
                    reason="the coverage phase takes about 2.5 minutes on 2 cores: set SPECDEC_SCHEMATHESIS_COVERAGE=1")
def test_schemathesis_coverage_phase(live, tmp_path, monkeypatch):
    """Schemathesis' coverage phase (every boundary and negative case the document implies, ~1300 requests)."""
    monkeypatch.setenv("SPECDEC_TORCH_PROFILER_DIR", str(tmp_path / "profiles"))
    run = _schemathesis(live.url, tmp_path, "--phases", "coverage")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
