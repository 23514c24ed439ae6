"""The c1c3846 H100 sweep's fixed shapes re-scored at the SmolLM2 EAGLE-3 head's measured acceptance per
shape (this folder's CPU runs) instead of the acceptance model's draw: speedup = tokens a step x plain
ms / step ms, the step times as measured. Prints markdown."""
import json
from pathlib import Path

from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.policy import SpecShape

HERE = Path(__file__).resolve().parent
SWEEP = HERE.parent / "2026-11-26-h100-adaptive" / "c1c3846"
MODEL = AcceptanceModel.load(HERE.parents[2] / "specdec" / "data" / "acceptance" / "smollm2_eagle3_mt_bench.json")
measured = {}
for name in ("3x1x4", "5x4x8", "6x8x64"):
    measured[name] = json.loads((HERE / f"acc_{name}.json").read_text())["protocol"]["acceptance_length"]
measured["6x8x32"] = 3.9053398058252426  # ../2026-11-26-cpu-draft-w8a8-acceptance (as_is), the same protocol

print("| shape | measured tokens a step | the model's expectation | measured / model |")
print("|---|---|---|---|")
for name, real in measured.items():
    s = SpecShape.parse(name)
    model = MODEL.expected_committed(s.num_steps, s.topk, s.num_draft_tokens)
    print(f"| {name} | {real:.3f} | {model:.3f} | {real / model:.3f} |")
print()
shapes = list(measured)
print("| ctx | bs | " + " | ".join(shapes) + " | best |")
print("|---|---|" + "---|" * (len(shapes) + 1))
for ctx in (1024, 4096):
    run = json.loads((SWEEP / f"synthetic_ctx{ctx}.json").read_text())
    plain = {p["batch_size"]: p["step_ms"] for p in run["plain"]}
    for i, bs in enumerate(sorted(plain)):
        x = {name: measured[name] * plain[bs] / run["speculative"][name][i]["step_ms"] for name in shapes}
        best = max(x, key=x.get)
        print(f"| {ctx} | {bs} | " + " | ".join(f"{x[n]:.2f}x" for n in shapes) + f" | {best} |")
