"""On a host of two or more GPUs: an engine on ``cuda:N`` (N > 0), as a data-parallel replica runs,
serves requests (Triton launches on the current device, which the engine sets) and decodes as the
same engine on ``cuda:0``, also when another thread steps it (as the server's loop thread does)."""

import threading

import pytest
import torch

from .helpers import engine, make_pair, prompts_of

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_engine_on_a_later_gpu_decodes_as_on_the_first():
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([5, 17, 9], target.config.vocab_size, seed=3)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    outputs = []
    for index in (torch.cuda.device_count() - 1, 0):
        torch.cuda.set_device(0)  # the process's default, as a fresh replica starts
        device = f"cuda:{index}"
        eng = engine(target.to(device), draft.to(device), algorithm="EAGLE3", shape=(3, 1, 4), device=device,
                     attention_backend="triton")
        outputs.append([g["output_ids"] for g in eng.generate(input_ids=prompts, sampling_params=[params] * 3)])
        eng.shutdown()
    assert outputs[0] == outputs[1]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_engine_on_a_later_gpu_decodes_from_another_thread():
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([5, 17, 9], target.config.vocab_size, seed=3)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    device = f"cuda:{torch.cuda.device_count() - 1}"
    eng = engine(target.to(device), draft.to(device), algorithm="EAGLE3", shape=(3, 1, 4), device=device,
                 attention_backend="triton")
    expected = [g["output_ids"] for g in eng.generate(input_ids=prompts, sampling_params=[params] * 3)]
    got = []

    def loop():  # a fresh thread's current device is cuda:0
        eng.bind_thread()
        got.extend(g["output_ids"] for g in eng.generate(input_ids=prompts, sampling_params=[params] * 3))

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join()
    eng.shutdown()
    assert got == expected
