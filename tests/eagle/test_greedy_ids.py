"""A captured graph's argmax (``LogitsOutput.greedy_ids``) stands for the step's draw only where the draw
is the plain argmax: every request greedy, no logits processor (and, for ``sample_next``, no logprobs).
The model runner's graph path (run eagerly on CPU: the same function a graph captures) gives it equal to
the argmax of the logits it returns."""

from __future__ import annotations

import types

import pytest
import torch

from specdec.eagle.output import greedy_ids, sample_next
from specdec.forward import ForwardMode, LogitsOutput

from ..e2e.helpers import engine, make_pair, prompts_of


class _Sampling:
    """A SamplingInfo whose ``sample`` records its calls and draws token 7 for every request."""

    def __init__(self, *, greedy: bool, processing: bool = False, logprobs: int | None = None) -> None:
        self.is_all_greedy = greedy
        self.needs_processing = processing
        self.top_logprobs_num = logprobs
        self.sampled: list[torch.Tensor] = []

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        self.sampled.append(logits)
        return torch.full((logits.shape[0],), 7, dtype=torch.int64)


def _out(with_ids: bool = True) -> LogitsOutput:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    return LogitsOutput(next_token_logits=logits, greedy_ids=torch.tensor([1, 0]) if with_ids else None)


def test_the_graph_argmax_is_taken_for_an_all_greedy_unprocessed_step():
    sampling = _Sampling(greedy=True)
    assert sample_next(_out(), sampling).tolist() == [1, 0]
    assert greedy_ids(_out(), sampling).tolist() == [1, 0]
    assert sampling.sampled == []


@pytest.mark.parametrize("case", ["sampled", "processed", "logprobs", "no graph"])
def test_anything_else_samples_from_the_logits(case):
    sampling = _Sampling(greedy=case != "sampled", processing=case == "processed",
                         logprobs=2 if case == "logprobs" else None)
    out = _out(with_ids=case != "no graph")
    assert sample_next(out, sampling).tolist() == [7, 7]
    assert len(sampling.sampled) == 1 and sampling.sampled[0] is out.next_token_logits
    # verification takes the argmax (logprobs are recorded apart from it), not a processed or sampled draw
    assert (greedy_ids(out, sampling) is not None) == (case == "logprobs")


def test_a_host_sampling_without_the_optional_members_is_read_as_unprocessed():
    sampling = types.SimpleNamespace(is_all_greedy=True, sample=lambda logits: pytest.fail("sampled"))
    assert sample_next(_out(), sampling).tolist() == [1, 0]


@pytest.mark.parametrize("algorithm", [None, "EAGLE3"])
def test_the_graph_path_returns_the_argmax_of_its_logits(algorithm):
    target, draft = make_pair("EAGLE3", "mixed")
    eng = engine(target, draft, algorithm="EAGLE3", shape=(3, 1, 4)) if algorithm else engine(target)
    eng.capture_cuda_graphs([2, 4], use_graphs=False)  # the padded graph path, run eagerly
    seen = []
    forward = eng.runner.forward

    def recording(batch):
        out = forward(batch)
        seen.append((batch.forward_mode, out))
        return out

    eng.runner.forward = recording
    prompts = prompts_of([5, 9, 3], target.config.vocab_size, seed=4)
    eng.generate(input_ids=prompts, sampling_params=[{"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}] * 3)
    graph_modes = {mode for mode, out in seen if out.greedy_ids is not None}
    assert graph_modes == ({ForwardMode.TARGET_VERIFY} if algorithm else {ForwardMode.DECODE})
    for mode, out in seen:
        if out.greedy_ids is not None:
            assert torch.equal(out.greedy_ids, out.next_token_logits.argmax(-1))
        else:
            assert mode == ForwardMode.EXTEND  # prefills run eagerly: no graph, no argmax
