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


def test_simulated_acceptance_tables_gain_a_parent_axis_and_bad_ones_are_named(tmp_path):
    """A [depth][rank] table reads as one parent row; a [depth][parent rank][rank] one as it is; a
    ragged table, or a hazard outside [0, 1], is refused naming the file's flag."""
    import json

    def config(hazards):
        return SpecConfig(SpecAlgorithm.EAGLE3, None, 2, 2, 4, simulate_hazards=hazards)

    assert config([[0.8, 0.5], [0.6, 0.5]]).simulate_hazards == (((0.8, 0.5),), ((0.6, 0.5),))
    rows = [[[0.8, 0.5]], [[0.6, 0.5], [0.3, 0.4]]]  # depth 1 has one parent row, depth 2 two: ragged
    with pytest.raises(ConfigError, match="simulated acceptance model"):
        config(rows)
    rows[0].append([0.8, 0.5])
    assert config(rows).simulate_hazards[1][1] == (0.3, 0.4)
    with pytest.raises(ConfigError, match="simulated acceptance model"):
        config([[0.8, 1.5]])
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"hazards": [[0.8, -0.1]]}))
    with pytest.raises(ConfigError, match="--speculative-simulate-acceptance-model"):
        SpecConfig.from_flags("EAGLE3", speculative_simulate_acceptance_model=str(path))


def test_a_draft_trace_file_is_replayed_alone(tmp_path):
    """An .npz acceptance model is a draft trace (specdec.eagle.replay): the config keeps its path; a
    missing one is named by its flag; a trace and a constant accept length do not mix."""
    from specdec.engine.spec_profile import TRACE

    config = SpecConfig.from_flags("EAGLE3", speculative_simulate_acceptance_model=str(TRACE))
    assert config.simulate_trace == str(TRACE) and config.simulate_hazards is None
    with pytest.raises(ConfigError, match="--speculative-simulate-acceptance-model .*no such file"):
        SpecConfig.from_flags("EAGLE3", speculative_simulate_acceptance_model=str(tmp_path / "none.npz"))
    with pytest.raises(ConfigError, match="simulate one of"):
        SpecConfig.from_flags("EAGLE3", speculative_simulate_acceptance_model=str(TRACE),
                              speculative_simulate_accept_length=2.0)
