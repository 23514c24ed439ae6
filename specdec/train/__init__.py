"""Draft-head training: data, target regeneration, teacher-forced capture, EAGLE / EAGLE-3 trainer.

    data.py        training text and prompts (TinyStories train, GSM8K train, Alpaca seeds, AlpacaEval,
                   Spec-Bench translation/qa), eval prompts and near-duplicates excluded; prompt files
    chat.py        a prompt as one user turn in the tokenizer's chat template (instruct targets, benchmark)
    synth.py       user instructions the target writes itself from its chat template (Magpie), optionally
                   steered by given openings, cleaned
    generate.py    fast batched sampling for training data: fixed-length rounds over a dense KV cache
    regenerate.py  the target answers the training prompts itself (greedy or sampled), cached
    capture.py     teacher-forced target run: features the head conditions on + target logits
    attention.py   differentiable padded-batch attention with EAGLE-3's training-time-test mask
    losses.py      one training forward over the TTT steps: soft CE to the target (+ EAGLE-1 hidden loss)
    vocab.py       EAGLE-3 reduced draft vocab from token frequencies (d2t / t2d)
    trainer.py     AdamW + cosine schedule, per-step accuracy, resumable checkpoints
    cli.py         ``specdec train-draft`` (``main(argv)``); exports with ``save_draft_head``
    evaluate.py    acceptance-length grid and teacher-forced accuracy of trained heads (CPU or GPU)

Training code sits at the edge like the CLI: it may import the engine (for regeneration), and
nothing in the subsystem imports it.
"""
