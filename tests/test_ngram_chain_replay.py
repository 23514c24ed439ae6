"""``benchmarks/ngram_chain_replay.py``: tokens a drafted step for each chain rule, on answers worked by hand,
and the answers a plain run of ``offline.py --answers`` recorded."""

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "ngram_chain_replay", Path(__file__).resolve().parents[1] / "benchmarks" / "ngram_chain_replay.py")
replay = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(replay)

# a run of one token: the latest match leaves one token after it, a step commits 2; continued, one step
# drafts the 5 tokens still to come and commits 6
RUN = ([5, 7, 7], [7, 7, 7, 7, 7, 7, 7])
# a repeat of three tokens: every rule drafts the 1 2 3 after the first "1 2 3", all accepted: one step of 4
SPAN = ([1, 2, 3, 1, 2], [3, 1, 2, 3])


@pytest.mark.parametrize("answers, rule, expected", [
    ([RUN], "latest", 2.0), ([RUN], "repeat", 6.0), ([SPAN], "latest", 4.0), ([SPAN], "repeat", 4.0),
    ([SPAN], "vllm", 4.0), ([RUN, SPAN], "repeat", (6 + 4) / 2),
])
def test_tokens_per_drafted_step(answers, rule, expected):
    got = replay.tokens_per_drafted_step(answers, replay.RULES[rule], min_n=1, max_n=4, k=5)
    assert got == pytest.approx(expected)


def test_vllms_rule_takes_the_earliest_occurrence():
    history = np.array([1, 2, 8, 1, 2, 9, 1, 2])  # "1 2" ends at 1 and at 4: vLLM drafts after the first
    assert replay.earliest_longest(history, min_n=1, max_n=4, k=2).tolist() == [8, 1]
    assert replay.RULES["latest"](history, min_n=1, max_n=4, k=2).tolist() == [9, 1]


@pytest.mark.parametrize("name", ["answers.jsonl", "answers.jsonl.gz"])
def test_recorded_answers_by_workload_and_concurrency(tmp_path, name):
    path = tmp_path / name
    cells = [{"engine": "vllm", "workload": "a", "concurrency": 1, "prompts": [[1]], "answers": [[2]]},
             {"engine": "vllm", "workload": "a", "concurrency": 32, "prompts": [[3]], "answers": [[4]]},
             {"engine": "vllm", "workload": "b", "concurrency": 1, "prompts": [[5], [6]], "answers": [[7], [8]]}]
    text = "".join(json.dumps(c) + "\n" for c in cells)
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert replay.recorded_answers(str(path), 1) == {"a": [([1], [2])], "b": [([5], [7]), ([6], [8])]}
    assert replay.recorded_answers(str(path), 32) == {"a": [([3], [4])]}
    assert replay.recorded_answers(str(path), 1, "specdec") == {}
