"""On the GPU: prefills through piecewise CUDA graphs (specdec.cuda_graph.piecewise, on by default)
give the same tokens as eager prefills, whole or chunked, plain and speculative, on every backend
(attention runs eagerly between the pieces, so backends without decode graphs take part too).

fp32 keeps the comparison exact (the CPU test of the same path: tests/e2e/test_graph_paths.py).
"""

import pytest

from specdec.attention import available_backends
from specdec.forward import ForwardMode

from .helpers import assert_no_leak, engine, make_pair, prompts_of

pytestmark = pytest.mark.gpu

GPU_BACKENDS = [b for b in ("torch_native", "triton") if b in available_backends()]
LENGTHS, MAX_NEW = [1, 9, 4, 23, 2, 15, 6, 300, 41], [17, 5, 30, 12, 1, 24, 9, 6, 11]


@pytest.mark.parametrize("chunk", [None, 16], ids=["whole", "chunked16"])
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("algorithm", [None, "EAGLE3"], ids=lambda a: a or "plain")
def test_gpu_piecewise_prefill_equals_eager(algorithm, backend, chunk):
    target, draft = make_pair("EAGLE3", "mixed")
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=7)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in MAX_NEW]
    kw = dict(device="cuda", attention_backend=backend, piecewise_cuda_graph_max_tokens=256)
    if chunk:
        kw["chunked_prefill_size"] = chunk
    if algorithm:
        kw.update(draft=draft, algorithm=algorithm, shape=(5, 4, 8))
    eager = engine(target, disable_piecewise_cuda_graph=True, **kw)
    pieces = engine(target, **kw)
    assert eager.runner.prefill_graphs is None and pieces.runner.prefill_graphs.use_graphs
    expected = [eager.generate(input_ids=prompts[:7], sampling_params=params[:7]),
                eager.generate(input_ids=prompts[7:], sampling_params=params[7:])]
    # NOTE: after the eager engine's run: both engines run the same target module
    forward, eager_tokens = pieces.runner.model.forward, []
    pieces.runner.model.forward = lambda batch: (batch.forward_mode == ForwardMode.EXTEND
                                                 and eager_tokens.append(batch.num_tokens)) or forward(batch)
    got = [pieces.generate(input_ids=prompts[:7], sampling_params=params[:7]),
           pieces.generate(input_ids=prompts[7:], sampling_params=params[7:])]
    assert [[g["output_ids"] for g in part] for part in got] == [[e["output_ids"] for e in part] for part in expected]
    assert pieces.runner.prefill_graphs.num_calls > 0
    assert all(t > 256 for t in eager_tokens), eager_tokens  # only prefills past the largest count run eagerly
    assert_no_leak(pieces)
