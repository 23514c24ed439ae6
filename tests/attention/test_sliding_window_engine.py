"""A sliding-window model end to end on the triton backend: a tiny random Gemma 3 (a local layer of
window 4, then a global one: ``tests/models/hf_checkpoints.py``) gives through ``specdec.Engine`` the
same greedy tokens on triton as on torch_native (fp32), plainly and speculatively (EAGLE-3 over a
tree, on the padded static path that CUDA graphs replay). On CPU the kernels run in Triton's
interpreter and the static path eagerly; on a GPU the same tests replay CUDA graphs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..triton_env import import_kernels

import_kernels("specdec.attention.triton_backend")
pytest.importorskip("transformers")

from specdec.engine.engine import Engine  # noqa: E402
from specdec.models import load_target  # noqa: E402
from specdec.models.config import default_eagle3_layers  # noqa: E402

from ..models.hf_checkpoints import make_hf_model, write_eagle3_head  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WINDOW = 4
IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 52, 8, 95]
PROMPTS = [IDS[:7], IDS[3:12], IDS]  # 7, 9 and 14 tokens: every prompt overruns the window
MAX_NEW = 12


def write_gemma3(path: Path, window: int) -> Path:
    """hf_checkpoints' tiny Gemma 3 (seed 3) with its lm_head untied and its embeddings scaled by 1/8.

    NOTE: as written there, Gemma's sqrt(hidden) input scale makes each token's own embedding
    dominate the residual, and greedy decoding repeats the prompt's last token whatever attention
    sees (so whatever the window); the weights are the same for every ``window``.
    """
    with torch.no_grad():
        model = make_hf_model("gemma3", 3, sliding_window=window, tie_word_embeddings=False)
        model.model.embed_tokens.weight.mul_(1 / 8)
    model.save_pretrained(str(path))
    return path


def _engine(path: Path, backend: str, **kw) -> Engine:
    return Engine(str(path), attention_backend=backend, device=DEVICE, dtype="float32", **kw)


def _generate(engine: Engine, max_new: int = MAX_NEW, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    return write_gemma3(tmp_path_factory.mktemp("gemma3"), WINDOW)


@pytest.fixture(scope="module")
def plain(gemma3) -> list[list[int]]:
    """torch_native's greedy tokens: the reference."""
    return _generate(_engine(gemma3, "torch_native"))


def test_greedy_tokens_equal_torch_natives(gemma3, plain, tmp_path):
    assert _generate(_engine(gemma3, "triton")) == plain
    # the window decides tokens here: the same weights with a window past every context decode others
    wide = write_gemma3(tmp_path / "wide", 1000)
    assert _generate(_engine(wide, "torch_native")) != plain


def test_speculative_on_the_static_path_equals_plain(gemma3, plain, tmp_path):
    """EAGLE-3 with a random head, 2 steps of topk 2, 3 tree nodes, two requests: the target verifies
    each node as a decode step over its window, on the padded static path of a captured batch of 2
    (run eagerly on CPU, where the interpreter's cost grows with the batch and the steps)."""
    target = load_target(gemma3, aux_hidden_layers=default_eagle3_layers(2))
    head = write_eagle3_head(target, tmp_path / "head", draft_vocab_size=80)
    spec = _engine(gemma3, "triton", speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                   speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=3,
                   speculative_adaptive="off", cuda_graph_bs=[2])
    if DEVICE == "cpu":
        spec.capture_cuda_graphs([2], use_graphs=False)
    max_new, chosen = 4, [0, 2]
    got = _generate(spec, max_new, [PROMPTS[i] for i in chosen])
    assert got == [plain[i][:max_new] for i in chosen]
