"""``--enable-deterministic-inference``: the engine's side of the batch-invariant mode
(``specdec.forward.batch_invariant_enabled`` lists what each op does under it).

``deterministic_args`` runs once per engine, after the attention backend is resolved: it refuses
backends without the mode and sets the process-wide switch to the engine's setting. CUDA graphs stay
on: the mode's attention plan (``specdec.attention.rowwise``) builds every row's KV list on the
device, and its linear layers launch without a host sync, so decode and verify steps are captured
and replayed as on the default path.
"""

from __future__ import annotations

from specdec.attention import create_attention_backend
from specdec.engine.args import EngineArgs
from specdec.forward import set_batch_invariant


def deterministic_args(args: EngineArgs) -> EngineArgs:
    """``args`` as the engine runs them; sets the switch (off for an engine without the flag)."""
    set_batch_invariant(args.enable_deterministic_inference)
    if not args.enable_deterministic_inference:
        return args
    for name in dict.fromkeys(args.attention.split(":")):
        if not getattr(create_attention_backend(name), "supports_deterministic", False):
            raise ValueError(
                f"--enable-deterministic-inference: --attention-backend {name} has no batch-invariant mode "
                f"(its kernels split and tile by batch shape); use --attention-backend triton or torch_native")
    if args.tp_size > 1:
        raise ValueError("--enable-deterministic-inference: not with --tp-size > 1 (the all-reduce order is not fixed)")
    return args
