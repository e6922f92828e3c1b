"""What one decoder layer keeps for its backward pass, measured on CPU, beside the memory model's term.

    .venv/bin/python bench/memory_probe.py

Builds tiny random-weight Llama models with the installed transformers (and PEFT's LoRA), runs one forward under
bf16 autocast as tunedeck's trainer does, and counts every tensor autograd saves for the backward pass once per
storage (torch.autograd.graph.saved_tensors_hooks). One layer's share is the difference between a 3-layer and a
2-layer model (the first layer keeps less: its input, the embeddings' output, needs no gradient). It prints bytes
per token of one layer, measured and as backend/memory_activations.py counts them, in units of the hidden size h.

The probe runs on CPU, where two things differ from CUDA: dropout keeps its mask in the input's dtype (fp32 after
PEFT's cast: 4 bytes) where CUDA's native_dropout keeps a 1-byte bool, and attention runs SDPA's CPU flash kernel,
which keeps q, k, v, the output and the log-sum-exp as CUDA's flash and efficient kernels do. The dropout rows
therefore print the mask difference beside the totals.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunedeck.backend.memory_activations import _per_layer_activation_bytes  # noqa: E402
from tunedeck.backend.memory_job import Job, input_values  # noqa: E402
from tunedeck.backend.spec import JobSpec, set_paths  # noqa: E402

TOY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 512,
    "intermediate_size": 1376,  # Llama-2's 11008/4096 ratio
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
TOKENS = 256
CASES = {  # name: (method, lora_dropout, target_modules)
    "full fine-tuning": ("full", 0.0, None),
    "LoRA q,v": ("lora", 0.0, ["q_proj", "v_proj"]),
    "LoRA all-linear": ("lora", 0.0, "all-linear"),
    "LoRA q,v, dropout 0.05": ("lora", 0.05, ["q_proj", "v_proj"]),
}


def saved_bytes(layers: int, method: str, dropout: float, targets) -> int:
    """Bytes autograd saves during one forward of a toy model of `layers` layers (each storage once)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**TOY, "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=targets))
    model.train()
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    ids = torch.randint(0, TOY["vocab_size"], (1, TOKENS))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids)
    return sum(saved.values())


def measured_layer_bytes(method: str, dropout: float, targets) -> float:
    """Bytes per token one decoder layer keeps, measured."""
    return (saved_bytes(3, method, dropout, targets) - saved_bytes(2, method, dropout, targets)) / TOKENS


def predicted_layer_bytes(method: str, dropout: float, targets, *, mask_bytes: int = 1) -> float:
    """Bytes per token of one layer as backend/memory_activations.py counts them (CUDA's 1-byte dropout mask;
    mask_bytes=4 counts the CPU's)."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({**TOY, "num_hidden_layers": 3}), encoding="utf-8")
        settings = {"model.name_or_path": folder, "method": method, "dataset.max_seq_length": TOKENS}
        if method == "lora":
            settings.update({"lora.r": 8, "lora.lora_dropout": dropout, "lora.target_modules": targets})
        job = Job.from_values(input_values(set_paths(JobSpec(), settings)))
        per_layer = _per_layer_activation_bytes(job)
    if dropout > 0 and method == "lora":
        adapted = job.arch.adapted_weights(job.lora_targets)
        per_layer += (mask_bytes - 1) * sum(w.in_features for w in adapted)
    return per_layer


def main() -> int:
    h = TOY["hidden_size"]
    print(f"one decoder layer of a toy Llama (h={h}), bytes per token, in units of h:")
    for name, (method, dropout, targets) in CASES.items():
        measured = measured_layer_bytes(method, dropout, targets)
        predicted = predicted_layer_bytes(method, dropout, targets)
        line = f"  {name:26s} measured {measured / h:6.2f}h   model {predicted / h:6.2f}h"
        if dropout:
            on_cpu = predicted_layer_bytes(method, dropout, targets, mask_bytes=4)
            line += f"   (model with the CPU's 4-byte mask: {on_cpu / h:.2f}h)"
        print(line)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
