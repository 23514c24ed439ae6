"""What ``specdec bench --synthetic`` runs: its settings and the target shapes it picks from.

``SyntheticSettings`` holds the sweep's flags (validated on construction; the engine's flags are
``EngineArgs``, those the sweep takes listed in ``ENGINE_FLAGS``); ``SHAPES`` are the targets of a
real model's shape, written as config-only checkpoints (``write_dummy_checkpoint``) that the engine
loads with random weights. The sweep itself is ``specdec.bench.synthetic``. ``HF_CONFIGS`` are other
architectures' published ``config.json`` files, field for field, for the side-by-side runs beside vLLM
(``benchmarks/peer``; ``write_dummy_config``): both engines load them with random weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from specdec.engine.args import flag

ACCEPTANCE_MODELS = ("replay", "hazards", "none")
SHAPES = {
    # Llama-3.1-8B (hidden 4096, 32 layers, GQA 32/8, vocab 128256)
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                         max_position_embeddings=131072, rms_norm_eps=1e-5),
    # a small stand-in with the same structure, for CPU tests of the sweep
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}
DRAFT_VOCAB = {"llama-3.1-8b": 32000, "tiny": 128}
_GEMMA3_270M_LAYERS = 18
HF_CONFIGS = {
    # google/gemma-3-270m's config.json (Gemma3ForCausalLM, text only: 18 layers, hidden 640, MQA 4/1 of
    # head_dim 256, every 6th layer global, the others a 512-token window; vocab 262144, tied embeddings,
    # no softcapping), as transcribed in decoderesearch/circuit-tracer @ 6f93ef4ae2c4436698c90436b8a73c662d85d234
    # : tests/test_attributions_gemma3_nnsight.py (its _name_or_path, "openai-community/gpt2", left out);
    # the same fields as the fine-tunes' exports on the Hub (e.g. mariocde/functiongemma-270m-onnx).
    "gemma-3-270m": {
        "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                        for i in range(_GEMMA3_270M_LAYERS)],
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": _GEMMA3_270M_LAYERS, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0.dev0", "use_bidirectional_attention": False, "use_cache": True,
        "vocab_size": 262144,
    },
}
CONFIGS = [(3, 1, 4), (5, 4, 8), (6, 8, 32)]
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64]


SYNTH = "synthetic benchmark"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticSettings:
    """The sweep's settings; the engine's (device, backend, graphs, overlap) are ``EngineArgs``."""

    synthetic: str = dataclasses.field(metadata=flag("target shape (random weights)", group=SYNTH,
                                                     choices=sorted(SHAPES)))
    acceptance_model: str = dataclasses.field(default="replay", metadata=flag(
        "the simulated verify's acceptance: 'replay' (the SmolLM2 EAGLE-3 head's recorded trees and target "
        "paths on MT-bench: each step replays one, the draft's tree following its scores), 'hazards' (that "
        "head's acceptance hazards by depth, parent rank and rank: one static ranking), a path (a hazards "
        "JSON or a trace .npz of 'python -m specdec.cli.bench acceptance'), or 'none' (a constant mean, TAU)",
        group=SYNTH, metavar="PATH"))
    speculative_simulate_accept_length: float = dataclasses.field(default=3.5, metadata=flag(
        "with --acceptance-model none: mean committed tokens per verify step", group=SYNTH, metavar="TAU"))
    skip_adaptive: bool = dataclasses.field(default=False, metadata=flag(
        "leave out adaptive speculation (a shape per step, bounded by the largest --configs)", group=SYNTH))
    batch_sizes: str = dataclasses.field(default=",".join(map(str, BATCH_SIZES)), metadata=flag(
        "comma-separated batch sizes", group=SYNTH))
    configs: str = dataclasses.field(default=";".join(",".join(map(str, c)) for c in CONFIGS), metadata=flag(
        "(steps, topk, draft tokens) triples, e.g. '3,1,4;5,4,8'", group=SYNTH))
    context_len: int = dataclasses.field(default=1024, metadata=flag("prompt tokens per request", group=SYNTH))
    server_context_length: int | None = dataclasses.field(default=None, metadata=flag(
        "the engines' --context-length, which bounds the lengths their CUDA graphs plan attention for, as a "
        "server's does (its default: the model's, up to 8192); default: just what the run needs", group=SYNTH,
        metavar="L"))
    decode_steps: int = dataclasses.field(default=24, metadata=flag(
        "timed tokens per request and point: plain decoding's timed steps; a speculative policy runs the "
        "steps that commit as many", group=SYNTH))
    warmup_steps: int = dataclasses.field(default=3, metadata=flag("untimed decode steps first", group=SYNTH))
    seed: int = dataclasses.field(default=0, metadata=flag("weights, prompts and the engine's sampler", group=SYNTH))
    output: str = dataclasses.field(default="bench_synthetic.json", metadata=flag("JSON results file", group=SYNTH))
    plot: str | None = dataclasses.field(default=None, metadata=flag(
        "speedup vs batch size as a PNG (matplotlib)", group=SYNTH, metavar="PATH"))
    profile_host: str | None = dataclasses.field(default=None, metadata=flag(
        "after each engine's sweep, profile the host (cProfile) over the timed steps at the profiled batch "
        "sizes, and write the top functions to PATH", group=SYNTH, metavar="PATH"))
    profile_device: str | None = dataclasses.field(default=None, metadata=flag(
        "after each engine's sweep, profile the device (torch.profiler, kernels inside CUDA graphs included) "
        "over the timed steps at the profiled batch sizes, and write the kernels by total GPU time to PATH "
        "(kernel times overlap under programmatic dependent launch; SPECDEC_PDL=0 in the environment turns it "
        "off)", group=SYNTH, metavar="PATH"))
    profile_batch_sizes: str | None = dataclasses.field(default=None, metadata=flag(
        "comma-separated batch sizes --profile-host and --profile-device profile, each one of --batch-sizes "
        "(default: the smallest and the largest)", group=SYNTH, metavar="BS"))
    profile_trace: str | None = dataclasses.field(default=None, metadata=flag(
        "with --profile-device, also write each profiled point's timeline (Chrome trace, gzipped) to "
        "DIR/<engine>_bs<N>.json.gz: every kernel in order, for the gaps and the phases a table hides",
        group=SYNTH, metavar="DIR"))

    def __post_init__(self) -> None:
        parse_configs(self.configs)
        if self.acceptance_model not in ACCEPTANCE_MODELS and not Path(self.acceptance_model).is_file():
            raise ValueError(f"--acceptance-model {self.acceptance_model!r}: not one of "
                             f"{', '.join(ACCEPTANCE_MODELS)} or a file")
        if self.profile_trace and not self.profile_device:
            raise ValueError("--profile-trace: needs --profile-device (the trace is of the profiled steps)")
        self.profiled_batch_sizes()  # NOTE: validates --profile-batch-sizes

    def swept_batch_sizes(self) -> list[int]:
        sizes = _sizes(self.batch_sizes)
        if not sizes or sizes[0] < 1:
            raise ValueError(f"--batch-sizes {self.batch_sizes!r}: expected comma-separated integers >= 1")
        return sizes

    def profiled_batch_sizes(self) -> list[int]:
        """The batch sizes the profilers run at: --profile-batch-sizes, else the sweep's ends."""
        swept = self.swept_batch_sizes()
        if self.profile_batch_sizes is None:
            return sorted({swept[0], swept[-1]})
        sizes = _sizes(self.profile_batch_sizes)
        if not sizes or not set(sizes) <= set(swept):
            raise ValueError(f"--profile-batch-sizes {self.profile_batch_sizes!r}: expected comma-separated "
                             f"batch sizes among --batch-sizes {self.batch_sizes}")
        return sizes

    def acceptance_path(self) -> str | None:
        """The acceptance model's file, hazards JSON or trace .npz (None: the constant accept length)."""
        from specdec.engine.spec_profile import PRIOR, TRACE

        return {"none": None, "hazards": str(PRIOR), "replay": str(TRACE)}.get(self.acceptance_model,
                                                                              self.acceptance_model)


# the engine flags the sweep takes, and their defaults here
ENGINE_FLAGS = {"device": "cuda", "attention_backend": "triton", "prefill_attention_backend": None,
                "decode_attention_backend": None, "disable_cuda_graph": False,
                "overlap_schedule": None, "tp_size": 1, "speculative_draft_model_quantization": None,
                "speculative_draft_kv_cache_dtype": "auto", "disable_custom_all_reduce": False,
                "speculative_draft_tp": "auto"}


def parse_configs(text: str) -> list[tuple[int, int, int]]:
    try:
        configs = [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]
    except ValueError:
        configs = []
    if not configs or any(len(c) != 3 for c in configs):
        raise ValueError(f"--configs: expected 'steps,topk,draft_tokens;...', got {text!r}")
    return configs


def _sizes(text: str) -> list[int]:
    """Sorted distinct integers of a comma-separated flag value ([] if one is not an integer)."""
    try:
        return sorted({int(b) for b in text.split(",")})
    except ValueError:
        return []


# ----------------------------------------------------------------------------- models
def write_dummy_checkpoint(shape: str, root: Path) -> tuple[str, str]:
    """(target, EAGLE-3 head) directories holding only ``config.json``: the engine loads them with
    ``--load-format dummy`` (random weights drawn on the device, an 8B model in seconds; under
    tensor parallelism every rank draws its own shard)."""
    from specdec.models.config import LlamaConfig

    config = LlamaConfig(**SHAPES[shape])
    target, head = root / f"{shape}-target", root / f"{shape}-eagle3"
    target.mkdir(parents=True, exist_ok=True)
    head.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config.to_hf() | {"architectures": ["LlamaForCausalLM"]}))
    head_cfg = dataclasses.replace(config, num_hidden_layers=1).to_hf()
    head_cfg |= {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": DRAFT_VOCAB[shape]}
    (head / "config.json").write_text(json.dumps(head_cfg))
    return str(target), str(head)


def write_dummy_config(name: str, root: Path, **overrides: object) -> str:
    """``root/<name>-target`` holding only ``HF_CONFIGS[name]`` as ``config.json`` (with ``overrides``,
    for tests at a smaller scale): specdec's ``Engine(path, load_format="dummy")`` and vLLM's
    ``LLM(path, load_format="dummy")`` load it with random weights. A changed ``num_hidden_layers``
    without ``layer_types`` keeps the model's rule (every ``_sliding_window_pattern``-th layer global)."""
    config = dict(HF_CONFIGS[name]) | overrides
    if "layer_types" in config and "layer_types" not in overrides:
        pattern = config["_sliding_window_pattern"]
        config["layer_types"] = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                 for i in range(config["num_hidden_layers"])]
    target = root / f"{name}-target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)
