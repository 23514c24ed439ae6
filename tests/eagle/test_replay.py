"""Acceptance replayed from recorded draft trees (specdec.eagle.replay): the recorder reads the draft's
lists back into probabilities and frontier keys, the path ranks follow the recorded frontier, the
replayed tree grows deep where the recorded draft is sure and wide where it is not, and the synthetic
engine's steps commit exactly what the host-side replay of their trace rows says."""

import dataclasses

import numpy as np
import pytest
import torch

from specdec.eagle.replay import DraftReplay, DraftTrace, TraceRecorder, _path_ranks, replay_accept_lengths
from specdec.eagle.tree import select_top_k_tokens
from specdec.engine.spec_profile import TRACE


def _trace(probs, keys, path_ranks) -> DraftTrace:
    return DraftTrace(np.asarray(probs, dtype=np.float16), np.asarray(keys, dtype=np.int16),
                      np.asarray(path_ranks, dtype=np.int8))


# K = 2, S = 2. Row 0: the draft is sure, a (.9) then a's child c (.9); row 1: it is not, a .5, b .45,
# a's children .3 and .2. The target's path: row 0 takes a then c; row 1 takes b (rank 1), then b's
# rank-0 child, which row 1's recording never expanded (its depth-2 frontier is a's two children).
ROWS = _trace(
    probs=[[[[0.9, 0.05], [0, 0]], [[0.9, 0.05], [0.5, 0.4]]],
           [[[0.5, 0.45], [0, 0]], [[0.3, 0.2], [0.25, 0.2]]]],
    keys=[[[0, 1], [0, 1]], [[0, 1], [0, 1]]],
    path_ranks=[[0, 0], [1, -1]],
)


def test_the_replayed_tree_is_deep_where_the_draft_is_sure_and_wide_where_it_is_not():
    """Three nodes (N = 3) of (2, 2): row 0 keeps a and c (.81 > .05), so it accepts a, c; row 1 keeps
    a and b (.45 > .3) and accepts b. The chain (2, 1, 3) accepts a, c and nothing."""
    replay = DraftReplay(ROWS, torch.device("cpu"))
    rows = torch.tensor([0, 1])
    assert replay_accept_lengths(replay, rows, 2, 2, 3).tolist() == [2, 1]
    assert replay_accept_lengths(replay, rows, 2, 1, 3).tolist() == [2, 0]
    assert replay_accept_lengths(replay, rows, 1, 2, 3).tolist() == [1, 1]  # depth 1 only: a, b
    assert ROWS.expected_committed(2, 2, 3) == pytest.approx(1 + 1.5)
    with pytest.raises(ValueError, match="cannot replay 3 steps of top-2"):
        replay_accept_lengths(replay, rows, 3, 2, 4)


def test_an_unexpanded_node_has_children_of_probability_zero():
    """Slot K (2) stands for a node the recording never expanded: children of probability 0, which
    lead to slot K again."""
    replay = DraftReplay(ROWS, torch.device("cpu"))
    rows = torch.tensor([0, 1])
    root_p, slots, children = replay.root(rows, 2, children=True)
    np.testing.assert_allclose(root_p, [[0.9, 0.05], [0.5, 0.45]], atol=1e-3)
    assert slots.tolist() == [[0, 1], [0, 1]]
    np.testing.assert_allclose(children.view(2, 2, 2), [[[0.9, 0.05], [0.5, 0.4]], [[0.3, 0.2], [0.25, 0.2]]],
                               atol=1e-3)
    # depth 1 -> 2 (S = 2: a depth-2 frontier has no recorded children; a third depth stands in):
    # each row's recorded depth-2 frontier is slot 0's children 0 and 1; slot 1's are not in it.
    # parents: score indices from k = 2: row 0 takes slot 0's children (2, 3), row 1 slot 1's child 0 (4)
    deeper = dataclasses.replace(ROWS, probs=np.concatenate([ROWS.probs, ROWS.probs[:, 1:]], 1),
                                 keys=np.concatenate([ROWS.keys, ROWS.keys[:, 1:]], 1),
                                 path_ranks=np.concatenate([ROWS.path_ranks, ROWS.path_ranks[:, 1:]], 1))
    replay = DraftReplay(deeper, torch.device("cpu"))
    new_slots, children = replay.advance(rows, slots, torch.tensor([[2, 3], [4, 2]]), 1, 2)
    assert new_slots.tolist() == [[0, 1], [2, 0]]
    np.testing.assert_allclose(children.view(2, 2, 2), [[[0.9, 0.05], [0.5, 0.4]], [[0.0, 0.0], [0.3, 0.2]]],
                               atol=1e-3)
    sentinel = torch.full((2, 2), 2)
    assert replay.advance(rows, sentinel, torch.tensor([[2, 3], [4, 5]]), 1, 2)[0].tolist() == [[2, 2]] * 2


def test_path_ranks_follow_the_recorded_frontier():
    """Root at position 5; its children [7, 8]; slot 0 (7) -> [9, 3], slot 1 (8) -> [4, 6]; the depth-2
    frontier is (slot 1's child 1, slot 0's child 0) = keys [3, 0]; their children [1, 2] and [5, 4]."""
    children = np.array([[[7, 8], [0, 0]], [[9, 3], [4, 6]], [[1, 2], [5, 4]]])
    keys = np.array([[0, 1], [3, 0], [0, 0]])
    tokens = [0] * 5 + [99, 8, 6, 2]  # 8 is rank 1; then 8's child 6 (rank 1, frontier slot 0); then 2
    assert _path_ranks(tokens, 5, children, keys) == [1, 1, 1]
    assert _path_ranks([0] * 5 + [99, 7, 3, 1], 5, children, keys) == [0, 1, -1]  # 3: never expanded
    assert _path_ranks([0] * 5 + [99, 5, 1, 1], 5, children, keys) == [-1, -1, -1]  # 5: not a child


def test_the_recorder_reads_back_the_drafts_lists():
    """A (3, 2) expansion of random probabilities through the real frontier selection: the recorder's
    probabilities are the draft's, its keys name each new frontier node's parent slot and rank."""
    gen = torch.Generator().manual_seed(0)
    bs, k, steps = 3, 2, 3
    probs = [torch.rand(bs, k, generator=gen).sort(-1, descending=True).values]
    sel = select_top_k_tokens(0, probs[0], torch.arange(bs * k).view(bs, k), torch.zeros(bs, 1), None, k)
    lists, branches = ([sel.tree_info[0]], [sel.tree_info[1]], [sel.tree_info[2]]), [None]
    for step in range(1, steps):
        p = torch.rand(bs * k, k, generator=gen).sort(-1, descending=True).values
        probs.append(p.view(bs, k, k))
        sel = select_top_k_tokens(step, p, 100 * step + torch.arange(bs * k * k).view(bs * k, k),
                                  sel.hidden_states, sel.scores, k)
        for out, item in zip(lists, sel.tree_info):
            out.append(item)
        branches.append(sel.parent_branch)
    requests = ["r0", "r1", "r2"]
    recorder = TraceRecorder(lambda rows: [requests[r] for r in rows])
    recorder(*lists, torch.tensor([2, 0, 1]), torch.tensor([4, 4, 4]))
    row0 = [[t[:1] for t in items] for items in lists]  # r2's next expansion: 1 accepted and the bonus
    recorder(*row0, torch.tensor([2]), torch.tensor([6]))
    tokens = {"r0": [50] * 5 + [100, 101, 7], "r1": [50] * 5 + [5, 7], "r2": [50] * 5 + [0, 101, 7, 7]}
    trace = recorder.finish(lambda req: tokens[req], {"shape": "3x2x4"})
    # r1's output ends 2 tokens after the root, less than S = 3: its row is left out (past the end the
    # target's path is unknown), whatever its path; so is r2's second expansion
    assert trace.probs.shape == (2, 3, 2, 2) and trace.protocol == {"shape": "3x2x4"}
    assert trace.recorded.tolist() == [1, -1]  # r2 went on at length 6 = 4 + 1 + 1; r0 had no next step
    for depth in range(steps):  # slot j at depth d >= 1 is the j-th branch of the draft's d-th forward
        np.testing.assert_allclose(trace.probs[:, depth, 0 if depth == 0 else slice(None)],
                                   probs[depth][:2].numpy(), atol=1e-3)
    assert trace.keys[:, 0].tolist() == [[0, 1]] * 2
    for depth in range(1, steps):  # the depth + 1 frontier: branch * K + the child's rank
        ranks = lists[2][depth][:2] % k
        assert trace.keys[:, depth].tolist() == (branches[depth][:2] * k + ranks).tolist()
    # the paths (row b's root children are tokens 2b, 2b + 1; its first branch's children 100 + 4b + 0, 1):
    # row 0 (r2) takes its root child 0, then that child's child 1 (101), then 7, which is none of
    # the next children (or whose parent was not expanded); row 1 (r0): 100 is no root child
    assert trace.path_ranks.tolist() == [[0, 1, -1], [-1, -1, -1]]


ENGINES = [pytest.param(dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True), id="cpu"),
           pytest.param(dict(device="cuda", attention_backend="triton", cuda_graph_bs=(1, 2)), id="cuda-graphs",
                        marks=pytest.mark.gpu)]


@pytest.mark.parametrize("engine_kw", ENGINES)
@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 2, 4), (4, 4, 8), (6, 8, 32)])
def test_the_synthetic_engine_commits_what_the_replay_of_its_rows_accepts(tmp_path, shape, engine_kw):
    """A tiny random target and head replaying the shipped trace: the k-th decode step of a request
    commits exactly what ``replay_accept_lengths`` gives for the trace row keyed by k, whatever the
    shape (so shapes are compared on the same rows; on CUDA the draft loop with its replay runs as a
    CUDA graph)."""
    from specdec.bench.synthetic import write_dummy_checkpoint
    from specdec.engine.args import EngineArgs
    from specdec.engine.engine import Engine

    target, head = write_dummy_checkpoint("tiny", tmp_path)
    steps, k, n = shape
    args = EngineArgs(model_path=target, load_format="dummy", speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=head, speculative_num_steps=steps, speculative_eagle_topk=k,
                      speculative_num_draft_tokens=n, speculative_adaptive="off",
                      speculative_simulate_acceptance_model=str(TRACE), random_seed=3, max_running_requests=2,
                      **engine_kw)
    engine = Engine(args=args)
    try:
        prompt = list(range(1, 20))
        out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 60, "ignore_eos": True,
                                                                 "temperature": 0})
        accepted = out["meta_info"]["spec_accept_lengths"]
        if engine_kw["device"] == "cuda":
            assert engine.worker.draft_graph is not None and engine.worker.draft_graph.runner.use_graphs
        replay = engine.worker.replay
        host_replay = DraftReplay(replay.trace, torch.device("cpu"))
        keys = torch.arange(len(accepted), device=replay.probs.device)
        rows = torch.stack([replay.rows(keys[i:i + 1], engine.worker.simulate_seed)[0] for i in range(len(keys))])
        expected = replay_accept_lengths(host_replay, rows.cpu(), steps, k, n).tolist()
        assert accepted == expected and max(accepted) >= 2
    finally:
        engine.shutdown()


def test_the_shipped_trace_replays_its_own_run():
    """At the shape it was recorded at, the replay accepts at each row what the recorded run did
    (the same trees, cut from fp16 probabilities); narrow trees commit more than chains of as many
    nodes, as the head's own runs at those shapes did."""
    trace = DraftTrace.load(TRACE)
    steps, k, n = (int(x) for x in trace.protocol["shape"].split("x"))
    known = trace.recorded >= 0
    replayed = replay_accept_lengths(DraftReplay(trace, torch.device("cpu")), torch.arange(len(trace)), steps, k, n)
    assert known.mean() > 0.95 and (replayed.numpy()[known] == trace.recorded[known]).mean() > 0.995
    assert trace.expected_committed(3, 1, 4) < trace.expected_committed(3, 2, 4) < trace.expected_committed(5, 4, 8)


def test_a_trace_round_trips_through_its_file(tmp_path):
    path = tmp_path / "t.npz"
    dataclasses.replace(ROWS, protocol={"dataset": "x"}).save(path)
    back = DraftTrace.load(path)
    assert np.array_equal(back.probs, ROWS.probs) and np.array_equal(back.keys, ROWS.keys)
    assert np.array_equal(back.path_ranks, ROWS.path_ranks) and back.protocol == {"format": 1, "dataset": "x"}
    assert back.recorded.tolist() == [-1, -1]
    np.savez(tmp_path / "bad.npz", probs=ROWS.probs, keys=ROWS.keys, path_ranks=ROWS.path_ranks,
             recorded=np.zeros(2, np.int8), protocol=np.array('{"format": 0}'))
    with pytest.raises(ValueError, match="draft trace format 0"):
        DraftTrace.load(tmp_path / "bad.npz")
