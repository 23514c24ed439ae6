"""Facts about the installed FlashAttention-4 that the fa4 backend relies on, printed in one run.

Signature; LSE layout and what a row that sees no key gets; whether a split-KV paged call captures
in a CUDA graph; the tree mask_mod; decode time against num_splits and page size (the page-size-1
view of our token-granular cache against real pages). Run on the device: python scripts/fa4_probe.py
"""

from __future__ import annotations

import inspect
import json
import sys
import time

import torch


def timed(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # us


def main() -> None:
    from flash_attn.cute import flash_attn_varlen_func as fa

    facts: dict = {"signature": str(inspect.signature(fa))}
    dev, dt = "cuda", torch.bfloat16
    hq, hkv, d = 32, 8, 128
    # a row that sees no key (seqused_k 0) beside a normal one
    k = torch.randn(64, 1, hkv, d, device=dev, dtype=dt)
    q = torch.randn(2, hq, d, device=dev, dtype=dt)
    table = torch.arange(64, device=dev, dtype=torch.int32).view(2, 32)
    out, lse = fa(q, k, k, cu_seqlens_q=torch.tensor([0, 1, 2], device=dev, dtype=torch.int32), max_seqlen_q=1,
                  seqused_k=torch.tensor([0, 32], device=dev, dtype=torch.int32), page_table=table, causal=True,
                  return_lse=True)
    facts["lse_shape"] = list(lse.shape)
    facts["empty_row_lse"] = float(lse[0, 0])
    facts["empty_row_out_absmax"] = float(out[0].float().abs().max())
    facts["empty_row_out_finite"] = bool(torch.isfinite(out[0]).all())
    # decode timings: num_splits x page size
    rows = []
    for bs, ctx in ((1, 4096), (8, 4096), (32, 1024), (64, 4096), (128, 4096)):
        for page in (1, 16, 128):
            pages_per = ctx // page
            num_pages = bs * pages_per
            kc = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dt)
            vc = torch.randn_like(kc)
            tbl = torch.randperm(num_pages, device=dev).to(torch.int32).view(bs, pages_per)
            qq = torch.randn(bs, hq, d, device=dev, dtype=dt)
            cu = torch.arange(bs + 1, device=dev, dtype=torch.int32)
            used = torch.full((bs,), ctx, device=dev, dtype=torch.int32)
            floor = 2 * kc.numel() * 2 / 3.0e12 * 1e6
            for splits in (0, 1, 2, 4, 8, 16, 32):
                if page != 1 and splits not in (0, 1, 4):
                    continue
                try:
                    us = timed(lambda: fa(qq, kc, vc, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=used,
                                          page_table=tbl, causal=True, num_splits=splits))
                except Exception as e:  # noqa: BLE001
                    us = f"error {type(e).__name__}: {str(e)[:120]}"
                rows.append({"bs": bs, "ctx": ctx, "page": page, "splits": splits, "us": us, "floor_us@3TB/s": floor})
                print(rows[-1], flush=True)
            del kc, vc
    facts["decode"] = rows
    # CUDA graph capture of a split paged call
    try:
        kc = torch.randn(4096, 1, hkv, d, device=dev, dtype=dt)
        tbl = torch.randperm(4096, device=dev).to(torch.int32).view(4, 1024)
        qq = torch.randn(4, hq, d, device=dev, dtype=dt)
        cu = torch.arange(5, device=dev, dtype=torch.int32)
        used = torch.tensor([1024, 10, 500, 700], device=dev, dtype=torch.int32)
        call = lambda: fa(qq, kc, kc, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=used, page_table=tbl,  # noqa: E731
                          causal=True, num_splits=4, return_lse=True)
        ref = call()[0].clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o, _ = call()
        used.copy_(torch.tensor([3, 1024, 77, 1000], device=dev, dtype=torch.int32))
        g.replay()
        fresh = call()[0]
        facts["graph_split_capture"] = {"ok": True, "replay_matches_eager": bool(torch.allclose(o, fresh, atol=1e-2)),
                                        "changed": bool(not torch.allclose(o, ref))}
    except Exception as e:  # noqa: BLE001
        facts["graph_split_capture"] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    # the tree mask_mod
    try:
        sys.path.insert(0, ".")
        from specdec.attention.fa4_masks import tree_mask_mod

        t = time.time()
        tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], device=dev, dtype=torch.int32)
        kc = torch.randn(5, 1, hkv, d, device=dev, dtype=dt)
        vc = torch.randn_like(kc)
        qq = torch.randn(3, hq, d, device=dev, dtype=dt)
        o, _ = fa(qq, kc, vc, cu_seqlens_q=torch.tensor([0, 3], device=dev, dtype=torch.int32), max_seqlen_q=3,
                  seqused_k=torch.tensor([5], device=dev, dtype=torch.int32),
                  page_table=torch.arange(5, device=dev, dtype=torch.int32)[None], mask_mod=tree_mask_mod(),
                  aux_tensors=[tree])
        allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], device=dev, dtype=torch.bool)
        s = torch.einsum("nhd,mhd->hnm", qq.float(), kc[:, 0].float().repeat_interleave(4, 1)) * d**-0.5
        ref = torch.einsum("hnm,mhd->nhd", torch.softmax(s.masked_fill(~allowed, float("-inf")), -1),
                           vc[:, 0].float().repeat_interleave(4, 1))
        facts["mask_mod"] = {"ok": True, "max_err": float((o.float() - ref).abs().max()), "compile_s": time.time() - t}
    except Exception as e:  # noqa: BLE001
        import traceback

        facts["mask_mod"] = {"ok": False, "error": traceback.format_exc()[-1500:]}
    print(json.dumps({k: v for k, v in facts.items() if k != "decode"}, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main()
