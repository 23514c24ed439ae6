"""The defaults a new user gets: the fast path without flags (device, attention backend, running
requests, CUDA-graph batch sizes that cover every batch the engine runs)."""

import pytest
import torch

from specdec.cuda_graph import default_batch_sizes
from specdec.engine.args import DEFAULT_MAX_RUNNING_REQUESTS, EngineArgs
from specdec.engine.sizing import graph_batch_sizes, running_cap


def test_auto_device_and_running_requests():
    args = EngineArgs()
    assert args.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert args.max_running_requests == DEFAULT_MAX_RUNNING_REQUESTS["cuda" if args.device == "cuda" else "cpu"]
    assert EngineArgs(device="cuda").max_running_requests == 256
    assert EngineArgs(device="cpu").max_running_requests == 64
    assert EngineArgs(device="cuda", max_running_requests=8).max_running_requests == 8


@pytest.mark.parametrize("device, expected", [("cuda", "triton"), ("cuda:1", "triton"), ("cpu", "torch_native")])
def test_auto_attention_backend(device, expected):
    """Whatever the model: triton attends sliding windows too, under CUDA graphs."""
    args = EngineArgs(device=device)
    assert args.attention_backend == "auto"
    assert args.with_attention_resolved().attention == expected
    # a hybrid with one side named resolves the other
    hybrid = EngineArgs(device=device, prefill_attention_backend="fa4").with_attention_resolved()
    assert hybrid.attention == f"fa4:{expected}"


def test_a_named_backend_is_kept():
    args = EngineArgs(device="cuda", attention_backend="flashinfer")
    assert args.with_attention_resolved().attention == "flashinfer"


class _GraphBackend:
    supports_cuda_graph = True


def test_graphs_cover_every_running_batch_by_default():
    sizes = graph_batch_sizes("cuda", _GraphBackend(), None, None, False, 256)
    assert sizes == default_batch_sizes(256) and sizes[-1] == 256
    assert running_cap(sizes, 256) == 256
    # an explicit lower cap bounds the running batch: no batch runs eagerly
    capped = graph_batch_sizes("cuda", _GraphBackend(), 64, None, False, 256)
    assert capped[-1] == 64 and running_cap(capped, 256) == 64
    assert graph_batch_sizes("cpu", _GraphBackend(), None, None, False, 256) == []
    assert running_cap([], 256) == 256  # eager engines (CPU, --disable-cuda-graph) keep their setting


def test_prefill_graph_token_counts():
    """--piecewise-cuda-graph-*: the default counts up to the chunk size (at most 8192), an explicit
    list (up to the max where both are given), off with either disable flag; bad values name the flag."""
    assert EngineArgs(device="cuda").prefill_graph_tokens[-3:] == [4096, 6144, 8192]
    assert EngineArgs(device="cuda", chunked_prefill_size=1000).prefill_graph_tokens[-2:] == [768, 1000]
    assert EngineArgs(device="cuda", chunked_prefill_size=-1).prefill_graph_tokens[-1] == 8192
    assert EngineArgs(device="cuda", piecewise_cuda_graph_max_tokens=100).prefill_graph_tokens[-2:] == [96, 100]
    assert EngineArgs(device="cuda", piecewise_cuda_graph_tokens=(64, 16, 512)).prefill_graph_tokens == [16, 64, 512]
    assert EngineArgs(device="cuda", piecewise_cuda_graph_tokens=(16, 64, 512),
                      piecewise_cuda_graph_max_tokens=100).prefill_graph_tokens == [16, 64]
    assert EngineArgs(device="cuda", disable_piecewise_cuda_graph=True).prefill_graph_tokens == []
    assert EngineArgs(device="cuda", disable_cuda_graph=True).prefill_graph_tokens == []
    with pytest.raises(ValueError, match="--piecewise-cuda-graph-max-tokens=0"):
        EngineArgs(device="cuda", piecewise_cuda_graph_max_tokens=0)
    with pytest.raises(ValueError, match="--piecewise-cuda-graph-tokens=.*--piecewise-cuda-graph-max-tokens"):
        EngineArgs(device="cuda", piecewise_cuda_graph_tokens=(512,), piecewise_cuda_graph_max_tokens=100)
