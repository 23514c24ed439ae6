"""Tensor parallelism on CPU (gloo, 2 ranks): greedy output equals tp 1 token for token for plain
and EAGLE-3 decoding; bad --tp-size values and dying workers end in clear errors, never a hang."""

import dataclasses
import os
import shutil
import signal
import threading
import time

import pytest
import torch

pytest.importorskip("transformers")

from specdec.engine.engine import Engine  # noqa: E402
from specdec.engine.tp_worker import TPWorkerError  # noqa: E402
from specdec.models import load_target, save_draft_head  # noqa: E402
from specdec.models.eagle import EagleDraftModel  # noqa: E402

from ..builders import randomize_  # noqa: E402

PROMPTS = [[5, 17, 3, 88, 41, 9, 60], [2, 33, 71, 14, 52, 8, 95, 11, 4]]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=2,
            speculative_num_draft_tokens=5)


@pytest.fixture(scope="module")
def checkpoint(qwen3_tp_checkpoint):
    return qwen3_tp_checkpoint


def _outputs(engine, params=GREEDY):
    return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=params)]


def test_tp2_equals_tp1_plain_and_eagle3(checkpoint):
    path, head = checkpoint
    plain = _outputs(Engine(path))
    tp_plain = Engine(path, tp_size=2)
    try:
        assert tp_plain.runner.kv_cache.num_kv_heads == 1 and tp_plain.target_model.tp.size == 2
        assert _outputs(tp_plain) == plain
        sampled = {"temperature": 0.8, "top_k": 20, "max_new_tokens": 12, "ignore_eos": True}
        assert _outputs(tp_plain, sampled) == _outputs(Engine(path), sampled)  # same seed, same draws
    finally:
        tp_plain.shutdown()
    tp_spec = Engine(path, tp_size=2, speculative_draft_model_path=head, **SPEC)
    try:
        out = tp_spec.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in out] == plain
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)
    finally:
        tp_spec.shutdown()


def test_tp2_shards_the_draft_head_and_stays_lossless(checkpoint, tmp_path):
    """--speculative-draft-tp shard: the draft head is sharded as the target is: each rank holds half
    its query heads, MLP and lm_head rows (EAGLE-3 over its own draft vocabulary; EAGLE-1 on the
    target's lm_head shard, or, with a token map, on whole hot rows), and greedy output still equals
    tp 1 plain decoding."""
    path, head3 = checkpoint
    plain = _outputs(Engine(path))
    head1, target = _eagle1_head(path, tmp_path), load_target(path)
    token_map = tmp_path / "hot.pt"
    torch.save(torch.arange(0, 60, 2), token_map)  # 30 hot tokens
    # (algorithm, head, extra flags, lm_head rows on this rank): draft vocab 80 -> 40 a rank;
    # the target's vocab 97 -> 49 a rank; a token map's 30 rows whole
    cases = [("EAGLE3", head3, {}, 40), ("EAGLE", head1, {}, 49),
             ("EAGLE", head1, {"speculative_token_map": str(token_map)}, 30),
             ("EAGLE3", head3, {"speculative_draft_model_quantization": "fp8"}, 40)]  # each rank's shard
    heads = target.config.num_attention_heads
    for algorithm, head, extra, rows in cases:
        eng = Engine(path, tp_size=2, speculative_draft_model_path=str(head), speculative_draft_tp="shard",
                     **{**SPEC, "speculative_algorithm": algorithm, **extra})
        try:
            draft = eng.draft_model
            attn = (draft.midlayer if algorithm == "EAGLE3" else draft.layers[0]).self_attn
            assert attn.layer.num_heads == heads // 2 and draft.lm_head_weight.shape[0] == rows
            assert hasattr(draft.lm_head_weight, "fp8_copy") == ("speculative_draft_model_quantization" in extra)
            out = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            assert [o["output_ids"] for o in out] == plain, (algorithm, extra)
            assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)
        finally:
            eng.shutdown()


def _eagle1_head(path, tmp_path):
    head1 = tmp_path / "eagle1"
    target = load_target(path)
    config = dataclasses.replace(target.config, num_hidden_layers=1, qk_norm=False)  # an EAGLE-1 head is Llama
    save_draft_head(randomize_(EagleDraftModel(config, embed_tokens=target.embed_tokens,
                                               lm_head_weight=target.lm_head_weight), 3), head1)
    return head1


@pytest.mark.parametrize("choice", ["auto", "replicate", "replicate-eagle1"])
def test_tp2_replicates_a_small_draft_head_and_stays_lossless(checkpoint, choice, tmp_path):
    """--speculative-draft-tp replicate, and auto for a head this small (hidden 64 < 4096): every
    rank holds the whole head (all its heads and KV heads; EAGLE-3: all its draft-vocabulary rows;
    EAGLE-1: still the target's lm_head shard, gathered over the target's group), and greedy output
    equals tp 1 plain decoding."""
    path, head = checkpoint
    plain = _outputs(Engine(path))
    algorithm, rows = "EAGLE3", 80
    if choice.endswith("eagle1"):
        algorithm, rows, head = "EAGLE", 49, str(_eagle1_head(path, tmp_path))
    eng = Engine(path, tp_size=2, speculative_draft_model_path=head, speculative_draft_tp=choice.split("-")[0],
                 **{**SPEC, "speculative_algorithm": algorithm})
    try:
        draft, config = eng.draft_model, eng.draft_model.config
        attn = (draft.midlayer if algorithm == "EAGLE3" else draft.layers[0]).self_attn
        assert draft.tp.size == 1 and attn.layer.num_heads == config.num_attention_heads
        assert draft.kv_layout.num_kv_heads == config.num_key_value_heads and draft.lm_head_weight.shape[0] == rows
        out = eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in out] == plain
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)
    finally:
        eng.shutdown()


def test_tp2_adaptive_speculation(checkpoint, tmp_path):
    """Adaptive speculation picks a shape per step on every rank: the ranks must agree (rank 0's
    step costs are broadcast), or their collectives would diverge and hang."""
    path, head = checkpoint
    plain = _outputs(Engine(path))
    profile = tmp_path / "costs.json"
    engine = Engine(path, tp_size=2, speculative_draft_model_path=head, speculative_adaptive="on",
                    speculative_adaptive_profile=str(profile), max_running_requests=2, **SPEC)
    try:
        out = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in out] == plain
        assert profile.is_file()  # measured by all ranks together, written by rank 0
        assert sum(engine.scheduler.spec_shape_steps.values()) > 0
    finally:
        engine.shutdown()


def test_tp2_adaptive_choices_are_rank0s(checkpoint, tmp_path):
    """Serving under tensor parallelism, rank 0's policy alone chooses (and learns its served step
    times) and the other ranks take its choices: here rank 0 runs a cycle of every shape and plain
    steps that no rank's own policy would choose, and the output stays equal to tp 1's."""
    path, head = checkpoint
    plain = _outputs(Engine(path))
    engine = Engine(path, tp_size=2, speculative_draft_model_path=head, speculative_adaptive="on",
                    speculative_adaptive_profile=str(tmp_path / "costs.json"), max_running_requests=2,
                    dist_timeout=60, **SPEC)
    try:
        worker = engine.worker
        assert worker.policy.step_times is not None and worker.policy.explorer is not None
        cycle = [*worker.shapes, None]
        chosen = iter(cycle * 100)
        worker.policy.choose = lambda bs, ctx: next(chosen)
        assert _outputs(engine) == plain
        steps = engine.scheduler.spec_shape_steps
        assert set(steps) == {shape.name for shape in worker.shapes} | {"plain"}, steps
    finally:
        engine.shutdown()


# prompts that repeat spans, so n-gram lookups find matches
REPEATS = [[5, 17, 3, 88, 41, 5, 17, 3, 88, 41, 5, 17], [2, 33, 71, 14, 2, 33, 71, 14, 2, 33]]


def test_tp2_ngram_choices_are_rank0s(checkpoint):
    """NGRAM's cost-aware choice under tensor parallelism is rank 0's, relayed: rank 0 runs a cycle of
    plain steps and every verify size, and the output stays equal to tp 1's plain decoding."""
    path, _ = checkpoint
    params = {**GREEDY, "max_new_tokens": 24}
    plain = [o["output_ids"] for o in Engine(path).generate(input_ids=REPEATS, sampling_params=params)]
    engine = Engine(path, tp_size=2, speculative_algorithm="NGRAM", speculative_adaptive="on",
                    max_running_requests=2, dist_timeout=60)
    try:
        worker = engine.worker
        assert worker.policy is not None  # rank 0 chooses (the other ranks dropped theirs)
        sizes = iter([0, *worker.budget.sizes] * 100)
        worker.policy.choose = lambda rows, bs, max_size, *a: min(next(sizes), max_size)
        out = engine.generate(input_ids=REPEATS, sampling_params=params)
        assert [o["output_ids"] for o in out] == plain
        steps = engine.scheduler.spec_shape_steps
        assert steps["plain"] > 0 and sum(n for k, n in steps.items() if k != "plain") > 0, steps
    finally:
        engine.shutdown()


def _write_char_tokenizer(directory) -> None:
    """A tokenizer.json of one character per token, ids 3..96 (0-2 special), as the server tests'."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    alphabet = (" \n" + string.ascii_letters + string.digits + string.punctuation)[:94]
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, **{c: 3 + i for i, c in enumerate(alphabet)}},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(directory / "tokenizer.json"))


def test_tp2_stop_strings(checkpoint, tmp_path):
    """Stop strings are matched on each rank's own decoded tail: every rank ends a request in the
    same step (a rank that went on would meet the others in a different collective and hang)."""
    path, head = checkpoint
    shutil.copytree(path, tmp_path / "target")
    _write_char_tokenizer(tmp_path / "target")
    path = str(tmp_path / "target")
    reference = Engine(path)
    texts = [o["text"] for o in reference.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    params = [{**GREEDY, "stop": t[len(t) // 2: len(t) // 2 + 2]} for t in texts]  # from the middle of each
    expected = reference.generate(input_ids=PROMPTS, sampling_params=params)
    tp_spec = Engine(path, tp_size=2, speculative_draft_model_path=head, **SPEC)
    try:
        out = tp_spec.generate(input_ids=PROMPTS, sampling_params=params)
        assert [o["output_ids"] for o in out] == [o["output_ids"] for o in expected]
        assert [o["text"] for o in out] == [t[: t.index(p["stop"])] for t, p in zip(texts, params)]
        assert all(o["meta_info"]["finish_reason"] == "stop" for o in out)
        assert _outputs(tp_spec) == _outputs(reference)  # the ranks still step together
    finally:
        tp_spec.shutdown()


def test_tp_that_does_not_divide_the_heads(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ValueError, match="--tp-size 3 does not divide num_attention_heads=4"):
        Engine(path, tp_size=3)
    with pytest.raises(ValueError, match="tp-size"):
        Engine(target_model=load_target(path), tp_size=2)


def test_an_engine_left_running_is_shut_down_at_exit(checkpoint):
    """An engine with workers that the user never shuts down, even one the user no longer holds, stays
    in the set the interpreter's exit shuts down (``atexit``): its workers then stop and it leaves the
    set; ``with`` shuts it down at once."""
    import gc

    from specdec.engine import engine as engine_module

    path, _ = checkpoint
    engine = Engine(path, tp_size=2)
    procs = list(engine._tp_workers.procs)
    del engine  # NOTE: dropped by its user (a benchmark's engine local to main())
    gc.collect()
    assert len(engine_module._TP_ENGINES) == 1 and all(p.is_alive() for p in procs)
    engine_module._shut_down_live_engines()  # what the exit runs
    assert not engine_module._TP_ENGINES and not any(p.is_alive() for p in procs)
    with Engine(path, tp_size=2) as scoped:
        assert _outputs(scoped) == _outputs(Engine(path))
        procs = list(scoped._tp_workers.procs)
    assert scoped not in engine_module._TP_ENGINES and not any(p.is_alive() for p in procs)


def _worker_pid(engine) -> int:
    return engine._tp_workers.procs[0].pid


def test_worker_killed_between_steps(checkpoint):
    path, _ = checkpoint
    engine = Engine(path, tp_size=2)
    try:
        os.kill(_worker_pid(engine), signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(TPWorkerError, match=r"worker 1 died \(exit code -9\)"):
            engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    finally:
        engine.shutdown()


def test_worker_killed_inside_a_collective(checkpoint):
    path, _ = checkpoint
    engine = Engine(path, tp_size=2)
    long = {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}
    killer = threading.Timer(0.5, os.kill, args=(_worker_pid(engine), signal.SIGKILL))
    start = time.perf_counter()
    try:
        killer.start()
        with pytest.raises(TPWorkerError, match="worker 1 died"):
            for _ in range(50):  # each round decodes until the kill lands in one of its steps
                engine.generate(input_ids=PROMPTS, sampling_params=long)
        assert time.perf_counter() - start < 60
    finally:
        killer.cancel()
        engine.shutdown()


def test_worker_error_reaches_rank0_with_its_traceback(checkpoint):
    path, _ = checkpoint
    engine = Engine(path, tp_size=2)
    try:
        engine._tp_workers.send("no_such_call")  # the worker's scheduler has no such method: it raises
        with pytest.raises(TPWorkerError, match=r"(?s)worker 1 died \(exit code 1\).*AttributeError.*no_such_call"):
            engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    finally:
        engine.shutdown()


def test_step_cost_cache_is_per_tensor_parallel_size(checkpoint):
    """Step costs measured with tp 1 must not be read back for tp 2 (a step costs less there)."""
    from types import SimpleNamespace

    from specdec.engine.spec_profile import _cache_path
    from specdec.models.parallel import TPGroup

    path, _ = checkpoint

    def engine_of(target):
        return SimpleNamespace(
            target_model=target, draft_model=target, worker=SimpleNamespace(shapes=[], max_batch={}),
            memory=SimpleNamespace(req_to_token=torch.zeros(1), page_size=1),
            args=SimpleNamespace(attention="torch_native", disable_cuda_graph=True,
                                 speculative_draft_model_quantization=None,
                                 speculative_draft_kv_cache_dtype="auto"),
            scheduler=SimpleNamespace(overlap=False))

    one = _cache_path(engine_of(load_target(path)), [1, 2])
    two = _cache_path(engine_of(load_target(path, tp=TPGroup(rank=0, size=2))), [1, 2])
    assert one != two and one.parent == two.parent
