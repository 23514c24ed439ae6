"""Export a llama.cpp GGUF as a bf16 Hugging Face directory that specdec and vLLM both load.

    python benchmarks/peer/export_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-bf16

The side-by-side benchmark needs one set of weights both engines read the same way; vLLM reads
GGUF only through its own quantized kernels, so the weights are dequantized once (transformers'
GGUF reader: its tensor names and its undoing of llama.cpp's q/k row order) and written as
config.json, model.safetensors, the tokenizer (with its chat template) and generation_config.json
(end of turn as EOS, so both engines stop answers at the same token).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch


def export(gguf: str, out: str, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = os.path.split(os.path.abspath(gguf))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # only its parameter names: the reader maps GGUF names onto them
        model = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(model).__name__]
    config.dtype = str(dtype).removeprefix("torch.")
    tensors = load_gguf_checkpoint(gguf, return_tensors=True, model_to_load=model)["tensors"]
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [k for k in model.state_dict() if k not in tensors and k not in tied]
    if missing:
        raise ValueError(f"{gguf}: no tensors for {missing[:4]}")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()}, path / "model.safetensors",
              metadata={"format": "pt"})
    config.save_pretrained(path)
    _add_v4_keys(path / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(path)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(path)
    return path


def _add_v4_keys(file: Path) -> None:
    """transformers 5 writes ``rope_parameters`` and ``dtype``; a reader on transformers 4 looks for
    ``rope_theta`` and ``torch_dtype``: both are written."""
    import json

    config = json.loads(file.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    file.write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("out")
    args = parser.parse_args()
    print(f"Wrote {export(args.gguf, args.out)}")


if __name__ == "__main__":
    main()
