"""GPU check 2: measured peak memory of real training steps vs tunedeck's estimate.

Each case builds the architecture from the catalog with random weights directly on the GPU
(no download), runs a few optimizer steps of plain forward/backward (transformers' own loss,
which materializes the logits, so the estimate is asked with loss="materialized"), and
compares torch.cuda.max_memory_allocated with Estimate.allocated_gb.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.spec import JobSpec, catalog, set_paths

CASES = [
    (
        "Llama-2-7B LoRA r16 bf16 seq 2048",
        "meta-llama/Llama-2-7b-hf",
        {"method": "lora", "dataset.max_seq_length": 2048, "training.per_device_train_batch_size": 1},
    ),
    (
        "Llama-3.2-1B full bf16 seq 1024 x2",
        "meta-llama/Llama-3.2-1B",
        {"method": "full", "dataset.max_seq_length": 1024, "training.per_device_train_batch_size": 2},
    ),
    (
        "Llama-3.2-1B LoRA no checkpointing seq 1024",
        "meta-llama/Llama-3.2-1B",
        {
            "method": "lora",
            "dataset.max_seq_length": 1024,
            "training.per_device_train_batch_size": 1,
            "training.gradient_checkpointing": False,
        },
    ),
]


def job(model: str, changes: dict) -> JobSpec:
    base = {
        "model.name_or_path": model,
        "model.dtype": "bfloat16",
        "training.precision": "bf16",
        "training.gradient_checkpointing": True,
        "strategy.kind": "ddp",
        "launch.num_processes": 1,
        "training.optim": "adamw_torch",
    }
    return set_paths(JobSpec(), {**base, **changes})


def measure(spec: JobSpec, steps: int = 3) -> tuple[float, float, float]:
    """(peak allocated, peak reserved, allocated right after the model was built) in GiB."""
    arch = catalog.lookup(spec.model.name_or_path)
    config = LlamaConfig(
        num_hidden_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        head_dim=arch.head_size,
        use_cache=False,
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    torch.cuda.synchronize()
    load = torch.cuda.max_memory_allocated() / 2**30  # the load phase: the weights, before any step
    if spec.training.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.uses_adapter:
        from peft import LoraConfig, get_peft_model

        model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=spec.lora.r,
                lora_alpha=spec.lora.lora_alpha,
                target_modules=spec.lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    batch, seq = spec.training.per_device_train_batch_size, spec.dataset.max_seq_length
    for _ in range(steps):
        ids = torch.randint(0, arch.vocab_size, (batch, seq), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30, load
    del model, optimizer, params
    torch.cuda.empty_cache()
    return peak


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("FAIL peaks: no CUDA GPU visible to torch")
        return 1
    rows, worst = [], 0.0
    for title, model, changes in CASES:
        spec = job(model, changes)
        predicted = estimate(spec, loss="materialized")
        allocated, reserved, load = measure(spec)
        error = (predicted.allocated_gb - allocated) / allocated
        worst = max(worst, abs(error))
        phases = predicted.to_dict().get("phases") or {}  # the estimate's load/train split, where it has one
        rows.append(
            {
                "case": title,
                "measured_allocated_gb": round(allocated, 2),
                "measured_reserved_gb": round(reserved, 2),
                "measured_load_allocated_gb": round(load, 2),
                "predicted_phases": phases,
                "predicted_allocated_gb": round(predicted.allocated_gb, 2),
                "predicted_reserved_gb": round(predicted.reserved_gb, 2),
                "error": round(error, 3),
            }
        )
        print(
            f"  {title}: measured {allocated:.2f} GiB allocated ({reserved:.2f} reserved, {load:.2f} after load), "
            f"predicted {predicted.allocated_gb:.2f} ({predicted.reserved_gb:.2f}; phases {phases or 'n/a'}), error {error:+.1%}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)
    ok = worst <= 0.20
    print(("PASS" if ok else "FAIL") + f" peaks: worst error {worst:.1%} (limit 20%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
