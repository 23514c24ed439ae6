"""Probe: the draft step's attention (bs x topk branches over a shared prefix) at 8B head shapes, bf16 vs
FP8 cache, library kernel vs variants (tile width, warps, stages, FP8 widened to fp16 or bf16)."""
import itertools, json, os, sys
import torch
import triton
import triton.language as tl
from specdec.attention.triton_kernels.draft_decode import draft_decode_attention
from specdec.attention.triton_kernels.common import LOG2E, online_softmax_step, store_rows, split_chunk
from specdec.attention.kv_dtype import cast_kv
from specdec.bench.device_timing import graph_us

FP8 = torch.float8_e4m3fn


@triton.jit
def _k(Q, K, V, O, req_to_token, req_pool_indices, prefix_lens, ANCESTORS, sm_scale_log2, depth,
       stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_table, stride_anc,
       TOPK: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
       F16: tl.constexpr):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    table_row = tl.load(req_pool_indices + req).to(tl.int64)
    prefix_len = tl.load(prefix_lens + req).to(tl.int32)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    branch = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_valid = branch < TOPK
    token = (req * TOPK + branch).to(tl.int64)
    q = tl.load(Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    if F16:
        q = q.to(tl.float16)
    elif not K.dtype.element_ty.is_fp8():
        q = q.to(K.dtype.element_ty)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table = req_to_token + table_row * stride_table
    for start in range(0, prefix_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < prefix_len
        slot = tl.load(table + offs_n, mask=n_valid, other=0).to(tl.int64)
        k = tl.load(K + slot[None, :] * stride_ks + kv_head * stride_kh + offs_d[:, None], mask=n_valid[None, :], other=0.0).to(q.dtype)
        qk = tl.dot(q, k) * sm_scale_log2
        qk = tl.where(n_valid[None, :], qk, float("-inf"))
        v = tl.load(V + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :], mask=n_valid[:, None], other=0.0).to(q.dtype)
        m_i, l_i, acc = online_softmax_step(qk, v, m_i, l_i, acc, "native")
    o_ptrs = O + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    store_rows(acc, m_i, l_i, o_ptrs, o_ptrs, row_valid[:, None], row_valid, True)


def variant(q, kb, vb, r2t, rpi, plens, anc, out, cfg):
    bn, warps, stages, f16 = cfg
    bs = rpi.shape[0]
    topk = q.shape[0] // bs
    group = q.shape[1] // kb.shape[1]
    _k[(bs, kb.shape[1])](q, kb, vb, out, r2t, rpi, plens, anc, 0.088 * LOG2E, anc.shape[1],
                          q.stride(0), q.stride(1), kb.stride(0), kb.stride(1), vb.stride(0), vb.stride(1),
                          out.stride(0), out.stride(1), r2t.stride(0), anc.stride(0),
                          TOPK=topk, GROUP=group, HEAD_DIM=128, BLOCK_M=max(16, topk * group), BLOCK_N=bn, F16=f16,
                          num_warps=warps, num_stages=stages)


res = {}
dev = "cuda"
torch.manual_seed(0)
for ctx, bs, topk in [(1024, 64, 2), (1024, 64, 4), (4096, 64, 2), (4096, 32, 4), (1024, 16, 4)]:
    slots = bs * (ctx + 16)
    kb = torch.randn(slots, 8, 128, device=dev, dtype=torch.bfloat16)
    vb = torch.randn(slots, 8, 128, device=dev, dtype=torch.bfloat16)
    r2t = torch.randperm(slots, device=dev, dtype=torch.int32)[: bs * (ctx + 8)].view(bs, ctx + 8).contiguous()
    rpi = torch.arange(bs, device=dev, dtype=torch.int64)
    plens = torch.full((bs,), ctx, device=dev, dtype=torch.int64)
    # the variants fold no ancestors: give the library kernel none either
    anc = r2t[:, ctx:ctx + 1].repeat_interleave(topk, 0)[:, :0].contiguous()
    anc = torch.empty(bs * topk, 0, device=dev, dtype=torch.int32)
    q = torch.randn(bs * topk, 32, 128, device=dev, dtype=torch.bfloat16)
    for kvd in ("bf16", "fp8"):
        k_, v_ = (kb, vb) if kvd == "bf16" else (cast_kv(kb, FP8), cast_kv(vb, FP8))
        floor = bs * ctx * 8 * 128 * 2 * k_.element_size() / 3.0e12 * 1e6
        ref = torch.empty_like(q)
        lib = graph_us(lambda: draft_decode_attention(q, k_, v_, r2t, rpi, plens, anc, ref, sm_scale=0.088,
                                                      max_prefix_len=ctx), reps=50)
        row = {"lib": lib}
        for cfg in itertools.product((64, 128, 256), (2, 4), (2, 3), (False, True) if kvd == "fp8" else (False,)):
            out = torch.empty_like(q)
            try:
                variant(q, k_, v_, r2t, rpi, plens, anc, out, cfg)
                err = (out.float() - ref.float()).abs().max().item()
                if err > 2e-2:
                    row[str(cfg)] = f"err {err:.3g}"
                    continue
                row[str(cfg)] = graph_us(lambda: variant(q, k_, v_, r2t, rpi, plens, anc, out, cfg), reps=50)
            except Exception as ex:
                row[str(cfg)] = f"fail {type(ex).__name__}"
        ts = sorted((v, k) for k, v in row.items() if isinstance(v, float) and k != "lib")
        f16 = sorted((v, k) for v, k in ts if k.endswith("True)"))
        bf = sorted((v, k) for v, k in ts if not k.endswith("True)"))
        print(f"ctx {ctx} bs {bs} topk {topk} {kvd}: floor {floor:6.1f} lib {lib:6.1f}  best {bf[0][0]:6.1f} {bf[0][1]}"
              + (f"  best f16 {f16[0][0]:6.1f} {f16[0][1]}" if f16 else ""), flush=True)
        res[f"{ctx} {bs} {topk} {kvd}"] = row
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "draft_attn_probe.json"), "w"), indent=1)
