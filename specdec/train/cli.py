"""``specdec train-draft``: train an EAGLE / EAGLE-3 draft head for a target and export it.

    specdec train-draft --algorithm EAGLE --output-dir heads/eagle          (embedded stories260K)
    python -m specdec.train.cli --algorithm EAGLE3 --output-dir heads/e3 --draft-vocab-size 256
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

import argparse
import copy
import dataclasses
import hashlib
import json
import shlex
import sys
from pathlib import Path

import torch

from specdec.server.args import DEFAULT_MODEL


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec train-draft", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=DEFAULT_MODEL, help="target: HF directory, llama2.c .bin or .gguf "
                   "(default: the embedded stories260K)")
    p.add_argument("--algorithm", default="EAGLE", choices=["EAGLE", "EAGLE3"])
    p.add_argument("--output-dir", required=True, help="where the head (config.json, model.safetensors) goes")
    p.add_argument("--dataset", default="tinystories",
                   help="comma-separated: tinystories, gsm8k, alpaca, or .txt/.jsonl files (default tinystories)")
    p.add_argument("--num-samples", type=int, default=None, help="training prompts/texts to use (default: all)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256, help="tokens per training sequence (truncated)")
    p.add_argument("--ttt-steps", type=int, default=None,
                   help="draft steps per training position, own hidden fed back (default 1 EAGLE, 5 EAGLE3)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="EAGLE-3 reduced vocab: most frequent tokens (default min(vocab, 32000))")
    p.add_argument("--aux-layers", default=None,
                   help="EAGLE-3 target capture indices, comma-separated, as LlamaForCausalLM's "
                   "aux_hidden_layers (default SGLang's [2, L//2, L-3])")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="target and head dtype for regeneration and training (float32 uses TF32 matmuls on CUDA)")
    p.add_argument("--save-dtype", default="float32", choices=sorted(DTYPES),
                   help="dtype of the exported weights (float16 halves the checkpoint)")
    p.add_argument("--chat-template", default="auto", choices=["auto", "none"],
                   help="auto: render prompts as a user turn with the tokenizer's chat template when it has one")
    p.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="continue from a trainer checkpoint (default: WORK_DIR/<output-dir name>-<algorithm>.pt)")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("regeneration and details")
    g.add_argument("--regen-temperatures", default="0,1",
                   help="the target answers every prompt at each temperature ('' = human text only)")
    g.add_argument("--regen-max-new-tokens", type=int, default=192)
    g.add_argument("--regen-batch-size", type=int, default=128, help="prompts answered at once")
    g.add_argument("--regen-sampler", default="dense", choices=["dense", "engine"],
                   help="dense: batched rounds over a dense KV cache (fast); engine: specdec.Engine")
    g.add_argument("--regen-attention-backend", default="torch_native", help="attention backend (engine sampler)")
    g.add_argument("--synth-prompts", type=int, default=0,
                   help="also sample this many user instructions from the target's own chat template "
                   "(Magpie; cleaned and screened against evaluation prompts) and train on its answers")
    g.add_argument("--synth-max-new-tokens", type=int, default=96, help="longest synthesized instruction")
    g.add_argument("--synth-openings", default=None,
                   help="a text file of user-text openings (one a line, '#' comments) that synthesized "
                   "instructions start with, cycled (e.g. specdec/data/train_prompts/synth_openings.txt)")
    g.add_argument("--synth-output", default=None, help="write the kept synthesized prompts here (JSONL)")
    g.add_argument("--loss-on", default="response", choices=["response", "all"],
                   help="regenerated rows: predict only the response tokens, or every token")
    g.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: --epochs)")
    g.add_argument("--time-budget", type=float, default=None,
                   help="seconds for training + evaluation: the schedule is shortened to fit after 30 steps")
    g.add_argument("--deadline", type=float, default=None,
                   help="wall-clock time (epoch seconds) by which training + evaluation must end: sets (or "
                   "tightens) --time-budget when training starts, so start-up time is accounted for")
    g.add_argument("--init-from", default=None,
                   help="start from this exported head (same algorithm; an EAGLE-3 head keeps its draft vocab) "
                   "with a fresh optimizer and schedule, e.g. to continue a run in another session")
    g.add_argument("--checkpoint-every", type=int, default=200, help="steps between trainer checkpoints")
    g.add_argument("--regen-only", action="store_true", help="regenerate (fill the cache in --work-dir) and stop")
    g.add_argument("--no-human-text", action="store_true", help="train on regenerated text only")
    g.add_argument("--val-fraction", type=float, default=0.05, help="prompts held out for the final accuracy")
    g.add_argument("--hidden-weight", type=float, default=0.1, help="EAGLE-1 hidden regression weight")
    g.add_argument("--step-decay", type=float, default=0.8, help="TTT step s weighs step_decay**s")
    g.add_argument("--work-dir", default=None, help="trainer checkpoints and the regeneration cache "
                   "(default ~/.cache/specdec/train)")
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return p


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _split(samples: list, val_fraction: float) -> tuple[list, list]:
    n_val = int(round(len(samples) * val_fraction)) if len(samples) > 1 else 0
    return samples[n_val:], samples[:n_val]


def _synthesized(args: argparse.Namespace, tokenizer, target, work: Path) -> tuple[list[str], dict]:
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


def _synth_source(args: argparse.Namespace) -> str:
    return "magpie_steered" if args.synth_openings else "magpie"


def main(argv: list[str] | None = None) -> None:
    import random

    from specdec.models.llama import default_eagle3_layers
    from specdec.models.loaders import load_draft_head, load_target, read_num_layers, save_draft_head
    from specdec.models.tokenizer import load_tokenizer
    from specdec.train.chat import has_chat_template, render_user_prompt
    from specdec.train.data import Sample, load_samples
    from specdec.train.regenerate import RegenSettings, regenerate
    from specdec.train.trainer import DraftTrainer, TrainConfig, build_head
    from specdec.train.vocab import DraftVocab, build_draft_vocab, coverage, token_counts

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
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
                          engine_kwargs={
                              "device": args.device, "attention_backend": args.regen_attention_backend,
                              "max_running_requests": batch,
                              "max_total_tokens": batch * (max(map(len, prompts)) + args.regen_max_new_tokens + 16)})
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
        "command": "specdec train-draft " + shlex.join(argv), "algorithm": args.algorithm,
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


if __name__ == "__main__":
    main()
