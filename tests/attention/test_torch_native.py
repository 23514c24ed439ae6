"""torch_native backend against a per-query-row reference over explicitly listed visible slots."""

import math

import pytest
import torch

from specdec.attention import AttentionLayer, KVCache, create_attention_backend
from specdec.forward import ForwardBatch, ForwardMode

HQ, HKV, D = 4, 2, 16


def naive(q_row, visible_slots, cache, layer):
    """q_row [hq, d]; attention over the K/V at visible_slots, one head at a time."""
    k_buf, v_buf = cache.get_kv(layer.layer_id)
    out = torch.empty(HQ, D)
    for h in range(HQ):
        kv_h = h // (HQ // HKV)
        ks = k_buf[visible_slots, kv_h].float()
        vs = v_buf[visible_slots, kv_h].float()
        w = torch.softmax(ks @ q_row[h].float() * layer.scaling, dim=0)
        out[h] = w @ vs
    return out.flatten()


def setup(num_slots=200, max_reqs=8, ctx=64):
    cache = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=HKV, head_dim=D, dtype=torch.float32, device="cpu")
    cache.k_buffers[0].normal_()
    cache.v_buffers[0].normal_()
    table = torch.randperm(num_slots)[: max_reqs * ctx].view(max_reqs, ctx).to(torch.int32)
    layer = AttentionLayer(layer_id=0, num_heads=HQ, num_kv_heads=HKV, head_dim=D, scaling=1 / math.sqrt(D))
    return cache, table, layer


def run(batch, layer):
    backend = create_attention_backend("torch_native")
    backend.init_forward_metadata(batch)
    n = batch.num_tokens
    q = torch.randn(n, HQ * D)
    k = torch.randn(n, HKV * D)
    v = torch.randn(n, HKV * D)
    return q, k, v, backend.forward(q, k, v, layer, batch)


def make_batch(mode, cache, table, rows, prefix, extend, free_slots, **kw):
    n = sum(extend)
    return ForwardBatch(
        forward_mode=mode,
        input_ids=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n, dtype=torch.int64),
        out_cache_loc=free_slots[:n],
        req_pool_indices=torch.tensor(rows),
        prefix_lens=torch.tensor(prefix),
        extend_lens=torch.tensor(extend),
        req_to_token=table,
        kv_cache=cache,
        attn_backend=None,
        **kw,
    )


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.DRAFT_EXTEND])
def test_causal_with_prefix(mode):
    cache, table, layer = setup(num_slots=1000)
    rows, prefix = [3, 0, 5], [7, 0, 13]
    extend = [1, 1, 1] if mode == ForwardMode.DECODE else [5, 3, 1]
    free = torch.arange(900, 1000)
    batch = make_batch(mode, cache, table, rows, prefix, extend, free)
    q, k, v, out = run(batch, layer)
    t = 0
    for r, p, e in zip(rows, prefix, extend):
        own = batch.out_cache_loc[t : t + e]
        for j in range(e):
            visible = torch.cat([table[r, :p].long(), own[: j + 1]])
            torch.testing.assert_close(out[t + j], naive(q[t + j].view(HQ, D), visible, cache, layer), atol=1e-5, rtol=1e-5)
        t += e


def test_verify_tree_mask():
    """Tree per request: root 0 -> {1, 2}, 1 -> {3}; node sees its ancestors and itself."""
    cache, table, layer = setup(num_slots=1000)
    n = 4
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    rows, prefix = [1, 6], [9, 2]
    free = torch.arange(900, 1000)
    batch = make_batch(ForwardMode.TARGET_VERIFY, cache, table, rows, prefix, [n, n], free,
                       tree_mask=torch.cat([tree.flatten(), tree.flatten()]))
    q, k, v, out = run(batch, layer)
    for b, (r, p) in enumerate(zip(rows, prefix)):
        own = batch.out_cache_loc[b * n : (b + 1) * n]
        for i in range(n):
            visible = torch.cat([table[r, :p].long(), own[tree[i]]])
            torch.testing.assert_close(out[b * n + i], naive(q[b * n + i].view(HQ, D), visible, cache, layer), atol=1e-5, rtol=1e-5)


def test_draft_branches_see_only_their_ancestors():
    cache, table, layer = setup(num_slots=1000)
    topk, depth = 3, 2
    rows, prefix = [2, 4], [5, 11]
    ancestors = torch.randint(900, 1000, (len(rows) * topk, depth - 1))
    own = torch.arange(800, 800 + len(rows) * topk)
    ancestors = torch.cat([ancestors, own[:, None]], dim=1)
    batch = make_batch(ForwardMode.DECODE, cache, table, rows, prefix, [topk, topk], own, draft_ancestors=ancestors)
    q, k, v, out = run(batch, layer)
    for b, (r, p) in enumerate(zip(rows, prefix)):
        for j in range(topk):
            i = b * topk + j
            visible = torch.cat([table[r, :p].long(), ancestors[i]])
            torch.testing.assert_close(out[i], naive(q[i].view(HQ, D), visible, cache, layer), atol=1e-5, rtol=1e-5)


def test_writes_new_kv_into_cache():
    cache, table, layer = setup(num_slots=1000)
    free = torch.arange(900, 1000)
    batch = make_batch(ForwardMode.EXTEND, cache, table, [0], [4], [6], free)
    q, k, v, out = run(batch, layer)
    torch.testing.assert_close(cache.k_buffers[0][batch.out_cache_loc], k.view(-1, HKV, D))
    torch.testing.assert_close(cache.v_buffers[0][batch.out_cache_loc], v.view(-1, HKV, D))


def test_unknown_backend_names_flag():
    with pytest.raises(ValueError, match="--attention-backend"):
        create_attention_backend("nope")
