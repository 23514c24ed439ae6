import dataclasses

import pytest

from specdec.config import ConfigError, SpecAlgorithm, SpecConfig


def test_defaults_when_all_unset():
    cfg = SpecConfig.from_flags("EAGLE")
    assert (cfg.num_steps, cfg.topk, cfg.num_draft_tokens) == (5, 4, 8)


def test_topk_one_forces_chain():
    cfg = SpecConfig.from_flags("eagle3", speculative_num_steps=3, speculative_eagle_topk=1,
                                speculative_num_draft_tokens=16)
    assert cfg.algorithm is SpecAlgorithm.EAGLE3
    assert cfg.num_draft_tokens == 4 and cfg.is_chain


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(num_steps=0, topk=1, num_draft_tokens=1), "--speculative-num-steps"),
        (dict(num_steps=2, topk=0, num_draft_tokens=3), "--speculative-eagle-topk"),
        (dict(num_steps=2, topk=2, num_draft_tokens=40), "--speculative-num-draft-tokens"),
        (dict(num_steps=3, topk=1, num_draft_tokens=8), "--speculative-num-draft-tokens"),
        (dict(num_steps=3, topk=2, num_draft_tokens=4, accept_threshold_single=0.0), "--speculative-accept-threshold-single"),
        (dict(num_steps=3, topk=2, num_draft_tokens=4, accept_threshold_acc=1.5), "--speculative-accept-threshold-acc"),
        (dict(num_steps=2.5, topk=2, num_draft_tokens=4), "--speculative-num-steps"),
    ],
)
def test_impossible_combinations_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        SpecConfig(algorithm=SpecAlgorithm.EAGLE, draft_model_path=None, **kwargs)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="--speculative-algorithm"):
        SpecConfig.from_flags("MEDUSA")


def test_frozen_and_replace_revalidates():
    cfg = SpecConfig.from_flags("EAGLE")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.topk = 2
    with pytest.raises(ConfigError):
        dataclasses.replace(cfg, num_draft_tokens=1000)


def test_max_tree_size_is_allowed():
    cfg = SpecConfig.from_flags("EAGLE", speculative_num_steps=2, speculative_eagle_topk=2,
                                speculative_num_draft_tokens=1 + 2 + 4)
    assert cfg.num_draft_tokens == 7
