"""Why the Triton W8A8 GEMM is slow: variants of one kernel, their registers/spills/PTX, timed."""
import json, os, sys, itertools
import torch, triton, triton.language as tl
from specdec.bench.device_timing import graph_us
from specdec.models.ops import gemv
from specdec.models.ops.gemv_kernels import quantize_rows_fp8
from specdec.models.ops.launch import pdl_kwargs


@triton.jit
def k_var(xq_ptr, xs_ptr, wq_ptr, ws_ptr, out_ptr, M, N, K, stride_om,
          PDL: tl.constexpr, PROMOTE: tl.constexpr, USE_PROMOTE: tl.constexpr, W_KN: tl.constexpr,
          EVICT: tl.constexpr, I64: tl.constexpr, MASK_M: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if I64:
        offs_n = offs_n.to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if MASK_M:
            x = tl.load(xq_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        else:
            x = tl.load(xq_ptr + offs_m[:, None] * K + offs_k[None, :])
        if W_KN:
            if EVICT:
                w = tl.load(wq_ptr + offs_n[None, :] * K + offs_k[:, None], eviction_policy="evict_first")
            else:
                w = tl.load(wq_ptr + offs_n[None, :] * K + offs_k[:, None])
        else:
            if EVICT:
                w = tl.trans(tl.load(wq_ptr + offs_n[:, None] * K + offs_k[None, :], eviction_policy="evict_first"))
            else:
                w = tl.trans(tl.load(wq_ptr + offs_n[:, None] * K + offs_k[None, :]))
        if USE_PROMOTE:
            acc = tl.dot(x, w, acc, max_num_imprecise_acc=PROMOTE)
        else:
            acc = tl.dot(x, w, acc)
    acc *= tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    acc *= tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(tl.bfloat16), mask=m_mask[:, None] & n_mask[None, :])


def launch(xq, xs, q, s, bm, bn, warps, stages, **flags):
    m, k = xq.shape
    n = q.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    pdl = flags.pop("PDL")
    kw = pdl_kwargs(xq.device) if pdl else {"PDL": False}
    ck = k_var[(triton.cdiv(m, bm), triton.cdiv(n, bn))](xq, xs, q, s, out, m, n, k, out.stride(0), **flags,
                                                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_warps=warps,
                                                         num_stages=stages, **kw)
    return out, ck


base = dict(PDL=True, PROMOTE=128, USE_PROMOTE=True, W_KN=False, EVICT=True, I64=True, MASK_M=True)
variants = {
    "base": {},
    "no_pdl": dict(PDL=False),
    "no_promote": dict(USE_PROMOTE=False),
    "w_kn": dict(W_KN=True),
    "no_evict": dict(EVICT=False),
    "i32": dict(I64=False),
    "no_mask_m": dict(MASK_M=False),
    "plain": dict(PDL=False, USE_PROMOTE=False, W_KN=True, EVICT=False, I64=False, MASK_M=False),
    "plain_promote": dict(PDL=False, W_KN=True, EVICT=False, I64=False, MASK_M=False),
}
rows = []
for name, (n, k), m in [("down", (4096, 14336), 128), ("gate_up", (28672, 4096), 128)]:
    w = gemv.attach_fp8_copy_(torch.randn(n, k, device="cuda").mul_(k**-0.5).to(torch.bfloat16))
    q, s = w.fp8_copy
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    xq, xs = quantize_rows_fp8(x)
    ref = gemv.linear_w8a8_ref(x, q, s).float()
    print(name, "scaled_mm", graph_us(lambda: torch._scaled_mm(xq, q.t(), scale_a=xs[:, None], scale_b=s[None, :],
                                                        out_dtype=torch.bfloat16), reps=10, calls=20), flush=True)
    for (bm, bn, warps, stages) in [(128, 128, 8, 4), (64, 64, 4, 4), (128, 256, 8, 3)]:
        for vname, v in variants.items():
            flags = {**base, **v}
            out, ck = launch(xq, xs, q, s, bm, bn, warps, stages, **dict(flags))
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ptx = ck.asm["ptx"]
            us = graph_us(lambda: launch(xq, xs, q, s, bm, bn, warps, stages, **dict(flags)), reps=10, calls=20)
            row = dict(gemm=name, m=m, bm=bm, bn=bn, warps=warps, stages=stages, variant=vname, us=round(us, 1),
                       err=round(err, 5), regs=ck.n_regs, spills=ck.n_spills, shared=ck.metadata.shared,
                       wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"), cp_async=ptx.count("cp.async"),
                       tma=ptx.count("cp.async.bulk"), ld_local=ptx.count("ld.local"))
            rows.append(row)
            print(row, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "diag.json"), "w"), indent=1)
