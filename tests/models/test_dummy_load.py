"""``--load-format dummy``: a model of a checkpoint's shape from its config alone, with random
weights (benchmarks of full-size shapes); the engine decodes it losslessly like any other."""

import pytest
import torch

from specdec.bench.synthetic import write_dummy_checkpoint
from specdec.engine.engine import Engine
from specdec.engine.sizing import default_kv_tokens
from specdec.models import load_target
from specdec.models.loaders import load_draft_head
from specdec.models.llama import default_eagle3_layers
from specdec.models.parallel import TPGroup


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_dummy_checkpoint("tiny", tmp_path_factory.mktemp("dummy"))  # (target dir, head dir): config.json only


def test_dummy_target_has_the_config_shapes_and_seeded_weights(checkpoint):
    target_dir, _ = checkpoint
    a = load_target(target_dir, load_format="dummy", seed=3)
    b = load_target(target_dir, load_format="dummy", seed=3)
    c = load_target(target_dir, load_format="dummy", seed=4)
    cfg = a.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 4, 512)
    for (name, pa), (_, pb), (_, pc) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(pa, pb), name  # the same seed draws the same weights
        if name.endswith("norm.weight"):
            assert torch.all(pa == 1.0), name
        elif pa.dim() == 2:
            assert not torch.equal(pa, pc), name
            # N(0, 1/fan_in): the sample std is within a few percent of fan_in ** -0.5
            assert abs(pa.float().std().item() * pa.shape[-1] ** 0.5 - 1.0) < 0.15, name


def test_dummy_target_shard_has_the_rank_shapes(checkpoint):
    target_dir, _ = checkpoint
    whole = load_target(target_dir, load_format="dummy")
    shard = load_target(target_dir, load_format="dummy", tp=TPGroup(rank=1, size=2))
    full, part = whole.state_dict(), shard.state_dict()
    for name, dim in (("self_attn.q_proj", 0), ("self_attn.o_proj", 1), ("mlp.down_proj", 1)):
        key = f"model.layers.0.{name}.weight"
        assert part[key].shape[dim] * 2 == full[key].shape[dim], key


def test_dummy_eagle3_head_maps_the_first_draft_vocab_ids(checkpoint):
    target_dir, head_dir = checkpoint
    target = load_target(target_dir, load_format="dummy", aux_hidden_layers=default_eagle3_layers(4))
    head = load_draft_head(head_dir, target, load_format="dummy", seed=5)
    again = load_draft_head(head_dir, target, load_format="dummy", seed=5)
    assert head.draft_vocab_size == 128
    assert torch.equal(head.d2t, torch.zeros(128, dtype=torch.int64))
    assert head.t2d.sum().item() == 128 and bool(head.t2d[:128].all())
    # every tensor-parallel rank loads the whole head with the same seed: it must be the same head
    assert all(torch.equal(x, y) for x, y in zip(head.state_dict().values(), again.state_dict().values()))


def test_engine_decodes_dummy_weights_losslessly(checkpoint):
    target_dir, head_dir = checkpoint
    prompts = [[5, 17, 3, 88, 41, 9, 60], [2, 33, 71, 14]]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    plain = Engine(target_dir, load_format="dummy")
    spec = Engine(target_dir, load_format="dummy", speculative_algorithm="EAGLE3",
                  speculative_draft_model_path=head_dir, speculative_num_steps=3, speculative_eagle_topk=2,
                  speculative_num_draft_tokens=5)
    want = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    out = spec.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in out] == want
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)


def test_unknown_load_format_names_the_flag(checkpoint):
    target_dir, _ = checkpoint
    with pytest.raises(ValueError, match="--load-format='npcache'"):
        Engine(target_dir, load_format="npcache")
    with pytest.raises(ValueError, match="--load-format='pt'"):
        load_target(target_dir, load_format="pt")


def test_gpu_kv_pool_is_sized_by_this_rank_kv_heads(checkpoint, monkeypatch):
    """The default KV pool fits this rank's KV heads in free GPU memory: a tensor-parallel shard
    holds half the KV heads, so twice the token slots fit (no GPU needed: free memory is given)."""
    target_dir, _ = checkpoint
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 1 << 34))
    whole = load_target(target_dir, load_format="dummy")
    shard = load_target(target_dir, load_format="dummy", tp=TPGroup(rank=0, size=2))
    slots = [default_kv_tokens("cuda", m, None, [1], 1, 10**9) for m in (whole, shard)]
    assert shard.kv_layout.num_kv_heads * 2 == whole.kv_layout.num_kv_heads
    assert abs(slots[1] / slots[0] - 2.0) < 0.01


def test_gpu_kv_pool_counts_an_fp8_draft_cache(checkpoint, monkeypatch):
    """A draft whose KV cache is FP8 (``--speculative-draft-kv-cache-dtype``) takes a byte a value of
    each slot, not its weights' four (fp32): with a draft as large as the target, a slot costs 1.25
    of the target's bytes instead of 2 (the target itself stands in for the draft here)."""
    target_dir, _ = checkpoint
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 1 << 34))
    model = load_target(target_dir, load_format="dummy")
    auto, fp8 = (default_kv_tokens("cuda", model, model, [1], 1, 10**9, draft_kv=kv)
                 for kv in ("auto", "fp8_e4m3"))
    assert next(model.parameters()).dtype == torch.float32
    assert abs(fp8 / auto - 2.0 / 1.25) < 0.01
