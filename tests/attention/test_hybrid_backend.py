"""--prefill-attention-backend / --decode-attention-backend: prefill forwards go to one backend,
every other forward to the other, over the same KV cache; speculative decoding stays lossless.

On CPU the pair is torch_native (prefill) and triton under the interpreter (decode side); on the
H100 the GPU suite runs fa4:triton (tests/e2e/test_gpu_fa4.py).
"""

import collections
import types

import pytest
import torch

from ..triton_env import import_kernels

import_kernels("specdec.attention.triton_backend")

from specdec.attention import AttentionBackend, create_attention_backend  # noqa: E402
from specdec.attention.base import StaticPlan  # noqa: E402
from specdec.attention.hybrid import HybridAttentionBackend  # noqa: E402
from specdec.engine.args import EngineArgs  # noqa: E402
from specdec.forward import ForwardMode  # noqa: E402

from ..e2e.helpers import assert_no_leak, engine, make_pair, prompts_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_routes_prefill_to_one_backend_and_the_rest_to_the_other():
    backend = create_attention_backend("torch_native:triton")
    assert isinstance(backend, HybridAttentionBackend) and backend.name == "torch_native:triton"
    assert backend.backend_for(ForwardMode.EXTEND) is backend.prefill and backend.prefill.name == "torch_native"
    for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND):
        assert backend.backend_for(mode) is backend.decode and backend.decode.name == "triton"
    # CUDA graphs capture only decode-side forwards
    assert backend.supports_cuda_graph == backend.decode.supports_cuda_graph
    assert backend.plans_on_host == backend.decode.plans_on_host


def test_engine_args_name_the_pair():
    assert EngineArgs(attention_backend="triton").attention == "triton"
    assert EngineArgs(attention_backend="triton", prefill_attention_backend="triton").attention == "triton"
    assert EngineArgs(attention_backend="triton", prefill_attention_backend="fa4").attention == "fa4:triton"
    assert EngineArgs(prefill_attention_backend="fa4", decode_attention_backend="triton").attention == "fa4:triton"


def test_an_unknown_half_is_named():
    with pytest.raises(ValueError, match="'nope'"):
        create_attention_backend("torch_native:nope")


def _count_modes(monkeypatch) -> dict[str, collections.Counter]:
    """Forward modes each backend class attends, by backend name."""
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name in ("torch_native", "triton"):
        cls = type(create_attention_backend(name))
        original = cls.forward

        def forward(self, q, k, v, layer, batch, _original=original):
            seen[self.name][batch.forward_mode] += 1
            return _original(self, q, k, v, layer, batch)

        monkeypatch.setattr(cls, forward.__name__, forward)
    return seen


@pytest.mark.parametrize("page_size", [4])
def test_speculative_decoding_is_lossless_across_the_pair(monkeypatch, page_size):
    target, draft = make_pair("EAGLE", "mixed")
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    prompts = prompts_of([5, 9, 3], target.config.vocab_size, seed=3)
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (9, 6, 11)]
    kw = dict(device=DEVICE, page_size=page_size, prefill_attention_backend="torch_native",
              decode_attention_backend="triton", disable_cuda_graph=True)
    expected = engine(target, **kw).generate(input_ids=prompts, sampling_params=params)
    seen = _count_modes(monkeypatch)
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), **kw)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert set(seen["torch_native"]) == {ForwardMode.EXTEND}  # prompts, for the target and the draft head
    assert {ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND} <= set(seen["triton"])
    assert ForwardMode.EXTEND not in seen["triton"]
    assert_no_leak(spec)


class _Recorder(AttentionBackend):
    """A backend that records which calls reach it (no attention)."""

    def __init__(self, name: str, *, graphs: bool, host: bool, sliding: bool) -> None:
        self.name, self.supports_cuda_graph, self.plans_on_host = name, graphs, host
        self.supports_sliding_window = sliding
        self.calls: list[str] = []

    def plan_static(self, plan: StaticPlan) -> None:
        self.calls.append(f"plan {plan.forward_mode.name}")

    def init_forward_metadata(self, batch) -> None:
        self.calls.append(f"init {batch.forward_mode.name}")

    def forward(self, q, k, v, layer, batch):
        self.calls.append(f"forward {batch.forward_mode.name}")
        return q


@pytest.mark.parametrize("mode", list(ForwardMode), ids=lambda m: m.name)
def test_graph_and_host_planning_follow_the_decode_side(mode):
    """A host-planned decode side (FlashInfer-like) behind a device-planned prefill side (fa4-like):
    the graph runners see the decode side's flags, and static plans reach only the decode side."""
    prefill = _Recorder("p", graphs=False, host=False, sliding=True)
    decode = _Recorder("d", graphs=True, host=True, sliding=False)
    hybrid = HybridAttentionBackend(prefill, decode)
    assert (hybrid.name, hybrid.supports_cuda_graph, hybrid.plans_on_host) == ("p:d", True, True)
    assert not hybrid.supports_sliding_window  # only if both sides have it
    batch = types.SimpleNamespace(forward_mode=mode)
    q = torch.randn(3, 8)
    hybrid.init_forward_metadata(batch)
    assert hybrid.forward(q, q, q, None, batch) is q
    chosen, other = (prefill, decode) if mode == ForwardMode.EXTEND else (decode, prefill)
    assert chosen.calls == [f"init {mode.name}", f"forward {mode.name}"] and other.calls == []
    if mode != ForwardMode.EXTEND:  # graph runners plan only decode-side forwards
        decode.calls.clear()
        hybrid.plan_static(StaticPlan(mode, [4, 0], q_len=1, own=1, max_seq_len=16, device=q.device))
        assert decode.calls == [f"plan {mode.name}"] and prefill.calls == []
