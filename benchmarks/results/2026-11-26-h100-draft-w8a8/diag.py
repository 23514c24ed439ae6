"""Call 3 diagnostic: where W8A8's 1 % row errors come from (quantization or GEMM)."""
import torch
import torch.nn.functional as F
from specdec.models.ops import gemv
from specdec.models.ops import gemv_kernels as gk

torch.manual_seed(0)
for m, (n, k) in [(256, (28672, 4096)), (17, (6144, 8192)), (256, (4096, 4096))]:
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    gemv.attach_fp8_copy_(w)
    q, s = w.fp8_copy
    xq, xs = gk.quantize_rows_fp8(x)
    rq, rs = gemv.quantize_rows_fp8_ref(x)
    dq = (xq.view(torch.uint8) != rq.view(torch.uint8))
    print(f"m={m} n={n} k={k}: scales differ in {(xs != rs).sum().item()} rows, q in {dq.sum().item()} values")
    if dq.any():
        i, j = dq.nonzero()[0].tolist()
        print("  e.g.", (x[i, j].float() / xs[i]).item(), xq[i, j].float().item(), rq[i, j].float().item())
    own = F.linear(xq.double() * xs.double()[:, None], q.double() * s.double()[:, None])  # the GEMM's exact result
    for fast in (False, True):
        out = torch._scaled_mm(xq, q.t(), scale_a=xs[:, None], scale_b=s[None, :], out_dtype=torch.bfloat16,
                               use_fast_accum=fast).double()
        err = (out - own).norm(dim=1) / own.norm(dim=1)
        top = err.topk(3)
        print(f"  fast={fast}: row error median {err.median().item():.2e} max {top.values.tolist()} rows {top.indices.tolist()}")
        r = top.indices[0].item()
        e = (out[r] - own[r]).abs()
        c = e.topk(3)
        print(f"   worst row {r}: largest element errors {c.values.tolist()} at {c.indices.tolist()}, "
              f"values there {own[r, c.indices].tolist()} got {out[r, c.indices].tolist()}, row norm {own[r].norm().item():.3g}")
    # bf16 rounding of the exact result, for scale
    print(f"  bf16 rounding alone: row error max {((own.to(torch.bfloat16).double() - own).norm(dim=1) / own.norm(dim=1)).max().item():.2e}")
