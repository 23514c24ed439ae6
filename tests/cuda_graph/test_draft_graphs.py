"""The draft head's graphs read and write the ``DraftState`` themselves (run eagerly on CPU, the same
code path as replay): the draft loop's root expansions come from the requests' rows; the draft
extend stores each request's new root expansion in its row, and its padding requests' in the pad
row, never in a live request's row (a padding request's ``req_pool_indices`` entry is 0); a plain
step's one-token draft extend takes each request's one row, with no committed counts."""

import types

import torch

from specdec.eagle.cuda_graphs import EAGLEDraftCudaGraphRunner, EAGLEDraftExtendCudaGraphRunner
from specdec.eagle.state import DraftState

K, HIDDEN, T, MAX_REQS = 2, 4, 3, 10


def stub_draft():
    """A DraftRunner stand-in: ``extend`` returns the features at each request's output row (None:
    one row a request) as its root expansion; ``expand`` returns the root it was given."""

    def extend(*, input_ids, features, output_rows, **_):
        if output_rows is None:
            output_rows = torch.arange(input_ids.shape[0])
        picked = features[output_rows]  # [bs, HIDDEN]
        return picked[:, :K].clone(), input_ids[output_rows][:, None].repeat(1, K), picked.clone()

    def expand(topk_p, topk_index, hidden, **_):
        return topk_p.clone(), topk_index.clone(), hidden.clone()

    backend = types.SimpleNamespace(plans_on_host=False)
    return types.SimpleNamespace(attn_backend=backend, topk=K, num_steps=3, extend=extend, expand=expand)


def state_with_rows() -> DraftState:
    state = DraftState(max_reqs=MAX_REQS, topk=K, hidden_size=HIDDEN, dtype=torch.float32, device="cpu")
    state.topk_p.copy_(torch.arange(state.topk_p.numel(), dtype=torch.float32).view_as(state.topk_p))
    state.topk_index.copy_(torch.arange(state.topk_index.numel()).view_as(state.topk_index) + 1000)
    state.hidden.copy_(-torch.arange(state.hidden.numel(), dtype=torch.float32).view_as(state.hidden))
    return state


def test_draft_extend_stores_rows_and_padding_in_the_pad_row():
    state = state_with_rows()
    before = [t.clone() for t in (state.topk_p, state.topk_index, state.hidden)]
    runner = EAGLEDraftExtendCudaGraphRunner(
        stub_draft(), state, batch_sizes=[4], num_tokens_per_req=T, feature_size=HIDDEN,
        feature_dtype=torch.float32, pad_slot=99, max_seq_len=64, device=torch.device("cpu"), use_graphs=False)
    rows = torch.tensor([5, 2, 7])  # bs 3, replayed at 4: one padding request
    features = torch.randn(3 * T, HIDDEN)
    input_ids = torch.arange(3 * T) + 500
    committed = torch.tensor([1, 3, 2])
    out = runner(input_ids=input_ids, features=lambda buf: buf.copy_(features), positions=torch.zeros(3 * T, dtype=torch.long),
                 out_cache_loc=torch.zeros(3 * T, dtype=torch.long), req_pool_indices=rows,
                 seq_lens=torch.tensor([4, 9, 6]), num_committed=committed, state_rows=rows)
    last = torch.arange(3) * T + committed - 1  # each request's last committed token
    assert torch.equal(out[2], features[last])
    assert torch.equal(state.hidden[rows], features[last]) and torch.equal(state.topk_p[rows], features[last][:, :K])
    assert torch.equal(state.topk_index[rows], (input_ids[last])[:, None].repeat(1, K))
    untouched = [r for r in range(MAX_REQS) if r not in rows.tolist()]  # row 0 too: padding never writes there
    for now, then in zip((state.topk_p, state.topk_index, state.hidden), before):
        assert torch.equal(now[untouched], then[untouched])
    assert not torch.equal(state.hidden[state.pad_row], before[2][state.pad_row])  # the padding request's


def test_one_token_draft_extend_stores_each_requests_row():
    state = state_with_rows()
    runner = EAGLEDraftExtendCudaGraphRunner(
        stub_draft(), state, batch_sizes=[2, 4], num_tokens_per_req=1, feature_size=HIDDEN,
        feature_dtype=torch.float32, pad_slot=99, max_seq_len=64, device=torch.device("cpu"), use_graphs=False)
    assert set(runner.runner.inputs) == {"input_ids", "features", "positions", "out_cache_loc", "req_pool_indices",
                                         "seq_lens", "state_rows"}  # no committed counts: the one token is
    rows = torch.tensor([5, 2, 7])  # bs 3, replayed at 4: one padding request
    features, input_ids = torch.randn(3, HIDDEN), torch.tensor([501, 502, 503])
    out = runner(input_ids=input_ids, features=features, positions=torch.tensor([4, 9, 6]),
                 out_cache_loc=torch.tensor([40, 41, 42]), req_pool_indices=rows, seq_lens=torch.tensor([4, 9, 6]),
                 state_rows=rows)
    assert torch.equal(out[2], features) and torch.equal(state.hidden[rows], features)
    assert torch.equal(state.topk_index[rows], input_ids[:, None].repeat(1, K))
    assert runner.runner.buffers["out_cache_loc"][3].item() == 99  # the padding request's token: the pad slot


def test_draft_loop_reads_the_requests_rows():
    state = state_with_rows()
    runner = EAGLEDraftCudaGraphRunner(stub_draft(), state, batch_sizes=[4], max_seq_len=64,
                                       device=torch.device("cpu"), use_graphs=False)
    rows = torch.tensor([6, 1, 8])
    topk_p, topk_index, hidden = runner(req_pool_indices=rows, seq_lens=torch.tensor([3, 4, 5]))
    assert torch.equal(topk_p, state.topk_p[rows, :K]) and torch.equal(topk_index, state.topk_index[rows, :K])
    assert torch.equal(hidden, state.hidden[rows])
