"""Speculation switched off per request or above a batch-size threshold stays lossless and keeps
the draft cache in step."""

import pytest
import torch

from .helpers import assert_no_leak, engine, make_pair, prompts_of

GREEDY = {"temperature": 0, "ignore_eos": True}


def test_per_request_speculation_off_is_lossless():
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of([4, 9, 2, 13], target.config.vocab_size)
    params = [{**GREEDY, "max_new_tokens": 20, "speculative": i % 2 == 0} for i in range(4)]
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = engine(target, draft, algorithm="EAGLE", shape=(4, 2, 7))
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert [g["meta_info"]["spec_verify_ct"] > 0 for g in got] == [True, False, True, False]
    assert_no_leak(spec)


def test_batch_size_threshold_stops_and_resumes_speculation():
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([4, 9, 2, 13, 7], target.config.vocab_size, seed=2)
    max_new = [6, 8, 40, 10, 45]
    params = [{**GREEDY, "max_new_tokens": m} for m in max_new]
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = engine(target, draft, algorithm="EAGLE3", shape=(3, 2, 5), speculative_batch_size_threshold=2)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    # the long requests decoded plainly while 5 ran, then speculated once only they were left
    long = [g["meta_info"] for g, m in zip(got, max_new) if m >= 40]
    short = [g["meta_info"] for g, m in zip(got, max_new) if m < 40]
    assert all(m["spec_verify_ct"] > 0 for m in long)
    assert all(m["spec_verify_ct"] == 0 for m in short)
    assert_no_leak(spec)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_plain_steps_keep_draft_cache_in_step(algorithm):
    """Draft KV and root expansion after plain steps equal those after speculative steps."""
    target, draft = make_pair(algorithm, "mixed")
    prompt = prompts_of([6], target.config.vocab_size, seed=5)[0]
    params = {**GREEDY, "max_new_tokens": 30}

    def trajectory(threshold):
        eng = engine(target, draft, algorithm=algorithm, shape=(4, 2, 7), speculative_batch_size_threshold=threshold)
        req = eng.make_request(input_ids=prompt, sampling_params=params)
        eng.add_request(req)
        states = {}
        while eng.scheduler.has_work:
            eng.step()
            if req.finished:
                break
            slots = eng.memory.req_to_token[req.row, : req.kv_len].long()
            worker = eng.worker
            states[req.kv_len] = (
                torch.stack([k[slots] for k in worker.draft_kv.k_buffers]),
                worker.state.topk_index[req.row].clone(),
                worker.state.hidden[req.row].clone(),
            )
        return states

    speculative, plain = trajectory(None), trajectory(0)
    common = sorted(set(speculative) & set(plain))
    assert len(common) >= 4  # several speculative steps are compared
    assert len(plain) > len(common)
    for n in common:
        k_spec, top_spec, h_spec = speculative[n]
        k_plain, top_plain, h_plain = plain[n]
        torch.testing.assert_close(k_spec, k_plain, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(h_spec, h_plain, atol=1e-4, rtol=1e-4)
        assert torch.equal(top_spec, top_plain)


def test_token_map_restricts_draft_vocabulary(tmp_path):
    """EAGLE-2's hot-token list: proposals come from the listed ids only; output stays lossless."""
    from specdec.engine.engine import Engine
    from specdec.models.loaders import save_draft_head

    target, draft = make_pair("EAGLE", "mixed")
    save_draft_head(draft, tmp_path / "head")
    vocab = target.config.vocab_size
    hot = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: vocab // 2]
    torch.save(hot, tmp_path / "hot.pt")
    prompts = prompts_of([5, 8], vocab)
    params = {**GREEDY, "max_new_tokens": 24}
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = Engine(target_model=target, speculative_algorithm="EAGLE", speculative_draft_model_path=str(tmp_path / "head"),
                  speculative_token_map=str(tmp_path / "hot.pt"), speculative_num_steps=3, speculative_eagle_topk=2,
                  speculative_num_draft_tokens=5, max_total_tokens=4096)
    assert spec.draft_model.lm_head_weight.shape[0] == vocab // 2
    assert torch.equal(spec.worker.adapter.target_ids, hot)  # draft id i stands for target id hot[i]
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    torch.save(torch.tensor([0, vocab]), tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="--speculative-token-map"):
        Engine(target_model=target, speculative_algorithm="EAGLE", speculative_draft_model_path=str(tmp_path / "head"),
               speculative_token_map=str(tmp_path / "bad.pt"))
