import os
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared"


_TRITON_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


def pytest_collection_finish(session):
    # A test module that switches the Triton interpreter on at import must switch it off again:
    # left on, every CPU kernel call in every other test runs interpreted (minutes instead of ms).
    if os.environ.get("TRITON_INTERPRET") != _TRITON_INTERPRET_AT_START:
        raise pytest.UsageError("a test module changed TRITON_INTERPRET at import and did not restore it")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Tiny models on a 2-core machine: one intra-op thread is faster and immune to oversubscription.
torch.set_num_threads(1)


@pytest.fixture
def triton_interpreter(monkeypatch):
    """TRITON_INTERPRET=1 inside a test of Triton kernels when there is no GPU: the kernels were
    imported interpreted (tests/triton_env.py), and the code that dispatches CPU tensors to them
    reads the variable at call time. Kernel test modules opt in with
    ``pytestmark = pytest.mark.usefixtures("triton_interpreter")``."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _no_kv_leak(monkeypatch):
    """Every engine a test builds and leaves without work ends idle: no request row or KV page
    leaked, the prefix cache's pages all unlocked (tests/kv_leaks.py)."""
    from specdec.engine.engine import Engine

    from .kv_leaks import kv_idle_problems

    built = []
    init = Engine.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(Engine, "__init__", recording_init)
    yield
    for engine in built:
        scheduler = getattr(engine, "scheduler", None)
        if scheduler is None or scheduler.has_work or engine._tp_workers is not None:
            continue  # a failed start, left mid-run on purpose, or tensor-parallel (its ranks may be gone)
        problems = kv_idle_problems(engine)
        assert not problems, f"KV leak after the test: {'; '.join(problems)}"
