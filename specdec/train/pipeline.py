"""``specdec train-draft``: train an EAGLE / EAGLE-3 draft head for a target and export it.

    specdec train-draft --algorithm EAGLE --output-dir heads/eagle          (embedded stories260K)
    specdec train-draft --algorithm EAGLE3 --output-dir heads/e3 --draft-vocab-size 256
    scripts/train_smollm2.sh                                                (SmolLM2-135M-Instruct, GPU)

Pipeline: training samples (data.py, evaluation prompts excluded) [+ user instructions the target
writes itself, ``--synth-prompts`` (synth.py)] -> held-out split -> the target answers every prompt
(regenerate.py) -> train on human text + regenerated text (trainer.py; on regenerated rows only the
response is predicted, ``--loss-on``) -> ``save_draft_head`` (config.json + model.safetensors,
loadable by ``load_draft_head`` and ``--speculative-draft-model-path``) and training.json saying how.
A target whose tokenizer has a chat template (an instruct model) gets its prompts rendered as one
user turn (chat.py), as the benchmark prompts it. ``--regen-only`` fills the regeneration cache and
stops, so that several heads can then train at once on the same target-written data.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from specdec.engine.args import EngineArgs, flag
from specdec.engine.embedded import DEFAULT_MODEL

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


REGEN = "regeneration and details"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainDraftSettings:
    """``specdec train-draft``'s settings, one field a flag."""

    model_path: str = dataclasses.field(default=DEFAULT_MODEL, metadata=flag(
        "target: HF directory, llama2.c .bin or .gguf (default: the embedded stories260K)"))
    algorithm: str = dataclasses.field(default="EAGLE", metadata=flag("head kind", choices=["EAGLE", "EAGLE3"]))
    output_dir: str = dataclasses.field(metadata=flag("where the head (config.json, model.safetensors) goes"))
    dataset: str = dataclasses.field(default="tinystories", metadata=flag(
        "comma-separated: tinystories, gsm8k, alpaca, or .txt/.jsonl/.jsonl.gz files (default tinystories)"))
    num_samples: int | None = dataclasses.field(default=None, metadata=flag(
        "training prompts/texts to use (default: all)"))
    epochs: int = dataclasses.field(default=4, metadata=flag("passes over the training sequences"))
    lr: float = dataclasses.field(default=3e-3, metadata=flag("peak learning rate"))
    batch_size: int = dataclasses.field(default=16, metadata=flag("sequences per optimizer step"))
    max_len: int = dataclasses.field(default=256, metadata=flag("tokens per training sequence (truncated)"))
    ttt_steps: int | None = dataclasses.field(default=None, metadata=flag(
        "draft steps per training position, own hidden fed back (default 1 EAGLE, 5 EAGLE3)"))
    draft_vocab_size: int | None = dataclasses.field(default=None, metadata=flag(
        "EAGLE-3 reduced vocab: most frequent tokens (default min(vocab, 32000))"))
    aux_layers: str | None = dataclasses.field(default=None, metadata=flag(
        "EAGLE-3 target capture indices, comma-separated, as LlamaForCausalLM's aux_hidden_layers "
        "(default SGLang's [2, L//2, L-3])"))
    device: str = dataclasses.field(default="cpu", metadata=flag("cpu or cuda[:N]"))
    dtype: str = dataclasses.field(default="float32", metadata=flag(
        "target and head dtype for regeneration and training (float32 uses TF32 matmuls on CUDA)",
        choices=sorted(DTYPES)))
    save_dtype: str = dataclasses.field(default="float32", metadata=flag(
        "dtype of the exported weights (float16 halves the checkpoint)", choices=sorted(DTYPES)))
    chat_template: str = dataclasses.field(default="auto", metadata=flag(
        "auto: render prompts as a user turn with the tokenizer's chat template when it has one",
        choices=["auto", "none"]))
    resume: str | None = dataclasses.field(default=None, metadata=flag(
        "continue from a trainer checkpoint (default: WORK_DIR/<output-dir name>-<algorithm>.pt)",
        nargs="?", const="auto"))
    seed: int = dataclasses.field(default=0, metadata=flag("data order, initialisation and sampling"))
    regen_temperatures: str = dataclasses.field(default="0,1", metadata=flag(
        "the target answers every prompt at each temperature ('' = human text only)", group=REGEN))
    regen_max_new_tokens: int = dataclasses.field(default=192, metadata=flag(
        "longest regenerated answer", group=REGEN))
    regen_batch_size: int = dataclasses.field(default=128, metadata=flag("prompts answered at once", group=REGEN))
    regen_sampler: str = dataclasses.field(default="dense", metadata=flag(
        "dense: batched rounds over a dense KV cache (fast); engine: specdec.Engine", group=REGEN,
        choices=["dense", "engine"]))
    regen_attention_backend: str = dataclasses.field(default="torch_native", metadata=flag(
        "attention backend (engine sampler)", group=REGEN))
    synth_prompts: int = dataclasses.field(default=0, metadata=flag(
        "also sample this many user instructions from the target's own chat template (Magpie; cleaned and "
        "screened against evaluation prompts) and train on its answers", group=REGEN))
    synth_max_new_tokens: int = dataclasses.field(default=96, metadata=flag(
        "longest synthesized instruction", group=REGEN))
    synth_openings: str | None = dataclasses.field(default=None, metadata=flag(
        "a text file of user-text openings (one a line, '#' comments) that synthesized instructions start "
        "with, cycled (e.g. specdec/data/train_prompts/synth_openings.txt)", group=REGEN))
    synth_output: str | None = dataclasses.field(default=None, metadata=flag(
        "write the kept synthesized prompts here (JSONL)", group=REGEN))
    loss_on: str = dataclasses.field(default="response", metadata=flag(
        "regenerated rows: predict only the response tokens, or every token", group=REGEN,
        choices=["response", "all"]))
    max_steps: int | None = dataclasses.field(default=None, metadata=flag(
        "optimizer steps (default: --epochs)", group=REGEN))
    time_budget: float | None = dataclasses.field(default=None, metadata=flag(
        "seconds for training + evaluation: the schedule is shortened to fit after 30 steps", group=REGEN))
    deadline: float | None = dataclasses.field(default=None, metadata=flag(
        "wall-clock time (epoch seconds) by which training + evaluation must end: sets (or tightens) "
        "--time-budget when training starts, so start-up time is accounted for", group=REGEN))
    init_from: str | None = dataclasses.field(default=None, metadata=flag(
        "start from this exported head (same algorithm; an EAGLE-3 head keeps its draft vocab) with a fresh "
        "optimizer and schedule, e.g. to continue a run in another session", group=REGEN))
    checkpoint_every: int = dataclasses.field(default=200, metadata=flag(
        "steps between trainer checkpoints", group=REGEN))
    regen_only: bool = dataclasses.field(default=False, metadata=flag(
        "regenerate (fill the cache in --work-dir) and stop", group=REGEN))
    no_human_text: bool = dataclasses.field(default=False, metadata=flag(
        "train on regenerated text only", group=REGEN))
    val_fraction: float = dataclasses.field(default=0.05, metadata=flag(
        "prompts held out for the final accuracy", group=REGEN))
    hidden_weight: float = dataclasses.field(default=0.1, metadata=flag(
        "EAGLE-1 hidden regression weight", group=REGEN))
    step_decay: float = dataclasses.field(default=0.8, metadata=flag("TTT step s weighs step_decay**s", group=REGEN))
    work_dir: str | None = dataclasses.field(default=None, metadata=flag(
        "trainer checkpoints and the regeneration cache (default ~/.cache/specdec/train)", group=REGEN))
    num_threads: int | None = dataclasses.field(default=None, metadata=flag(
        "torch CPU threads (default: torch's)", group=REGEN))


def _split(samples: list, val_fraction: float) -> tuple[list, list]:
    n_val = int(round(len(samples) * val_fraction)) if len(samples) > 1 else 0
    return samples[n_val:], samples[:n_val]


def _synthesized(args: TrainDraftSettings, tokenizer, target, work: Path) -> tuple[list[str], dict]:
    """The cleaned synthesized instructions (cached in ``work``) and their cleaning counts."""
    from specdec.train.data import screen_prompts
    from specdec.train.synth import CleanStats, SynthSettings, read_openings, synthesize_prompts

    openings = read_openings(args.synth_openings) if args.synth_openings else ()
    settings = SynthSettings(num_samples=args.synth_prompts, max_new_tokens=args.synth_max_new_tokens,
                             batch_size=args.regen_batch_size, seed=args.seed, openings=openings)
    screen = screen_prompts()
    key = hashlib.sha1(json.dumps([str(args.model_path), args.dtype, dataclasses.asdict(settings), screen])
                       .encode()).hexdigest()[:12]
    cache = work / f"synth-{key}.json"
    if cache.is_file():
        state = json.loads(cache.read_text())
        print(f"synthesize: reusing {len(state['prompts'])} prompts from {cache}")
    else:
        stats = CleanStats()
        prompts = synthesize_prompts(target(), tokenizer, settings, screen, stats)
        state = {"prompts": prompts, "stats": {**dataclasses.asdict(stats), "screened_against": len(screen)}}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(state))
    print(f"synthesize: {state['stats']}")
    if args.synth_output:
        out = Path(args.synth_output)
        out.parent.mkdir(parents=True, exist_ok=True)
        source = _synth_source(args)
        out.write_text("".join(json.dumps({"prompt": p, "source": source}) + "\n" for p in state["prompts"]))
    return state["prompts"], state["stats"]


def _synth_source(args: TrainDraftSettings) -> str:
    return "magpie_steered" if args.synth_openings else "magpie"


def train_draft(args: TrainDraftSettings, *, command: str = "specdec train-draft") -> None:
    """The whole pipeline (see the module doc); ``command`` is recorded in training.json."""
    import random

    from specdec.models.llama import default_eagle3_layers
    from specdec.models.loaders import load_draft_head, load_target, read_num_layers, save_draft_head
    from specdec.models.tokenizer import load_tokenizer
    from specdec.engine.chat import has_chat_template, render_user_prompt
    from specdec.train.data import Sample, load_samples
    from specdec.train.regenerate import RegenSettings, regenerate
    from specdec.train.trainer import DraftTrainer, TrainConfig, build_head
    from specdec.train.vocab import DraftVocab, build_draft_vocab, coverage, token_counts

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # NOTE: float32 training at TF32 speed; no effect on CPU
        torch.backends.cudnn.allow_tf32 = True
    dtype = DTYPES[args.dtype]
    out_dir = Path(args.output_dir)
    work = Path(args.work_dir) if args.work_dir else Path.home() / ".cache" / "specdec" / "train"
    ttt = args.ttt_steps or (5 if args.algorithm == "EAGLE3" else 1)
    config = TrainConfig(algorithm=args.algorithm, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                         ttt_steps=ttt, step_decay=args.step_decay, hidden_weight=args.hidden_weight, seed=args.seed,
                         checkpoint_every=args.checkpoint_every, max_steps=args.max_steps,
                         time_budget=args.time_budget)
    torch.manual_seed(args.seed)

    tokenizer = load_tokenizer(args.model_path)
    if tokenizer is None:
        raise ValueError(f"--model-path {args.model_path}: no tokenizer found next to the model")
    aux = None
    if args.algorithm == "EAGLE3":
        aux = (tuple(int(i) for i in args.aux_layers.split(",")) if args.aux_layers
               else default_eagle3_layers(read_num_layers(args.model_path)))
    loaded = []

    def target():  # loaded once, on first use (a run that hits every cache only loads it to train)
        if not loaded:
            loaded.append(load_target(args.model_path, aux_hidden_layers=aux, device=args.device, dtype=dtype))
        return loaded[0]

    samples = load_samples(args.dataset, num_samples=args.num_samples, seed=args.seed)
    synth_stats = None
    if args.synth_prompts:
        synth, synth_stats = _synthesized(args, tokenizer, target, work)
        samples += [Sample(prompt=p, response="", source=_synth_source(args)) for p in synth]
        random.Random(args.seed).shuffle(samples)  # NOTE: mixed before the held-out split
    train_samples, val_samples = _split(samples, args.val_fraction)
    cut = lambda ids: ids[: args.max_len]  # noqa: E731
    chat = args.chat_template == "auto" and has_chat_template(tokenizer)
    as_prompt = (lambda text: render_user_prompt(tokenizer, text)) if chat else (lambda text: text)  # noqa: E731
    prompts = [cut(tokenizer.encode(as_prompt(s.prompt))) for s in train_samples + val_samples]
    human = [[], []] if args.no_human_text else [[cut(tokenizer.encode(s.text)) for s in part]
                                                  for part in (train_samples, val_samples)]
    temps = tuple(float(t) for t in args.regen_temperatures.split(",") if t.strip())
    regen_train, regen_val, start_train, start_val = [], [], [], []
    if temps:
        settings = RegenSettings(model_path=str(args.model_path), temperatures=temps,
                                 max_new_tokens=args.regen_max_new_tokens, seed=args.seed, dtype=args.dtype,
                                 sampler=args.regen_sampler)
        key = hashlib.sha1(json.dumps([settings.__dict__, prompts]).encode()).hexdigest()[:12]
        batch = args.regen_batch_size
        seqs = regenerate(prompts, settings, cache=work / f"regen-{key}.pt", target=target, batch_size=batch,
                          engine_args=EngineArgs(
                              device=args.device, attention_backend=args.regen_attention_backend,
                              max_running_requests=batch,
                              max_total_tokens=batch * (max(map(len, prompts)) + args.regen_max_new_tokens + 16)))
        n_train = len(train_samples)
        for block in range(len(temps)):
            rows = seqs[block * len(prompts) : (block + 1) * len(prompts)]
            starts = [len(p) if args.loss_on == "response" else 0 for p in prompts]
            regen_train += [cut(s) for s in rows[:n_train]]
            regen_val += [cut(s) for s in rows[n_train:]]
            start_train += starts[:n_train]
            start_val += starts[n_train:]
    train_seqs, val_seqs = human[0] + regen_train, human[1] + regen_val
    train_starts, val_starts = [0] * len(human[0]) + start_train, [0] * len(human[1]) + start_val
    print(f"data: {len(train_samples)} train / {len(val_samples)} held-out prompts; "
          f"{len(train_seqs)} train sequences ({sum(map(len, train_seqs))} tokens), {len(val_seqs)} held-out"
          + (" (prompts in the chat template)" if chat else ""), flush=True)
    if args.regen_only:
        return

    vocab, cov = None, 1.0
    if args.algorithm == "EAGLE3":
        counts = token_counts(train_seqs, target().config.vocab_size)
        vocab = build_draft_vocab(counts, min(args.draft_vocab_size or 32000, target().config.vocab_size))
    if args.init_from:
        head = load_draft_head(args.init_from, target(), dtype=dtype, device=args.device)
        if type(head).__name__ != ("Eagle3DraftModel" if args.algorithm == "EAGLE3" else "EagleDraftModel"):
            raise ValueError(f"--init-from {args.init_from}: not an {args.algorithm} head")
        if vocab is not None:  # NOTE: the head's own draft vocab, whatever these counts would choose
            kept = (head.d2t + torch.arange(head.d2t.shape[0], device=head.d2t.device)).cpu()
            vocab = DraftVocab(kept=kept, d2t=head.d2t.cpu(), t2d=head.t2d.cpu())
    else:
        head = build_head(target(), args.algorithm, vocab=vocab, seed=args.seed)
    if vocab is not None:
        cov = coverage(counts, vocab)
        print(f"draft vocab: {int(vocab.kept.shape[0])} of {target().config.vocab_size} ids cover {cov:.2%} of training tokens")
    if args.deadline is not None:
        import time

        left = max(30.0, args.deadline - time.time() - 15.0)  # NOTE: 15 s to export after the evaluation
        config = dataclasses.replace(config, time_budget=min(left, config.time_budget or left))
    resume = args.resume is not None
    ckpt = work / f"{out_dir.resolve().name}-{args.algorithm}.pt" if args.resume in (None, "auto") else Path(args.resume)
    trainer = DraftTrainer(target(), head, config, train_seqs, val_seqs, train_starts=train_starts,
                           val_starts=val_starts, checkpoint_path=ckpt)
    result = trainer.train(resume=resume)
    save_dtype = DTYPES[args.save_dtype]
    # NOTE: cast a copy: the trained head shares its embedding with the target, which stays as it is
    save_draft_head((copy.deepcopy(head).to(save_dtype) if save_dtype != dtype else head).eval(), out_dir)
    acc = ", ".join(f"{a:.3f}" for a in result.val_accuracy)
    print(f"held-out top-1 accuracy per draft step: [{acc}]; rough chain acceptance "
          f"{result.expected_acceptance:.2f}; {result.steps} steps in {result.seconds:.0f}s")
    sources = {}
    for s in train_samples + val_samples:
        sources[s.source] = sources.get(s.source, 0) + 1
    summary = {
        "command": command, "algorithm": args.algorithm,
        "seed": args.seed, "epochs": args.epochs, "steps": result.steps, "steps_planned_by": result.planned_by,
        "train_seconds": round(result.seconds, 1), "init_from": args.init_from,
        "ttt_steps": ttt, "aux_hidden_layers": list(aux) if aux else None,
        "draft_vocab_size": int(vocab.kept.shape[0]) if vocab is not None else None, "draft_vocab_coverage": cov,
        "train_prompts": len(train_samples), "heldout_prompts": len(val_samples), "prompt_sources": sources,
        "synthesized_prompts": synth_stats,
        "train_sequences": len(train_seqs), "train_tokens": sum(map(len, train_seqs)),
        "loss_on": args.loss_on, "regen_sampler": args.regen_sampler,
        "regen_temperatures": list(temps), "regen_max_new_tokens": args.regen_max_new_tokens,
        "chat_template": chat, "device": args.device, "dtype": args.dtype, "save_dtype": args.save_dtype,
        "heldout_accuracy_per_step": [round(a, 4) for a in result.val_accuracy],
        "heldout_loss_per_step": [round(a, 4) for a in result.val_loss],
        "expected_chain_acceptance": round(result.expected_acceptance, 3),
    }
    (out_dir / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out_dir}/config.json, model.safetensors, training.json")

