"""``specdec.host``'s shared constants (``shared_arange``, ``shared_full``): equal to torch's, made once;
fresh under a CUDA graph capture (whose pool would own them)."""

import pytest
import torch

from specdec.host import shared_arange, shared_full


def test_equal_to_torch_and_shared():
    a = shared_arange(5, "cpu")
    assert torch.equal(a, torch.arange(5)) and a.dtype == torch.int64
    assert shared_arange(5, torch.device("cpu")) is a
    f = shared_full(3, 7, torch.int64, "cpu")
    assert torch.equal(f, torch.full((3,), 7)) and shared_full(3, 7, torch.int64, "cpu") is f
    assert shared_full(3, 7, torch.int32, "cpu").dtype == torch.int32  # a key of its own
    assert shared_full(3, 8, torch.int64, "cpu") is not f


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_capture_gets_a_fresh_tensor():
    shared = shared_arange(4, "cuda")
    graph, out = torch.cuda.CUDAGraph(), {}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
        with torch.cuda.graph(graph, stream=stream):
            out["inside"] = shared_arange(4, "cuda")
    assert out["inside"] is not shared
    assert shared_arange(4, "cuda") is shared  # the capture cached nothing
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out["inside"].cpu(), torch.arange(4))
