"""Where `from_pretrained` puts a model's weights on each rank, under each strategy's settings.

Run by tests/estimate/test_load_paths.py under `torchrun --nproc_per_node 2` (gloo, CPU):

    torchrun --nproc_per_node 2 tests/estimate/load_probe.py MODEL_DIR OUT_DIR

It sets what accelerate sets for each strategy before the model loads (the DeepSpeed config
that transformers reads through HfDeepSpeedConfig; ACCELERATE_USE_FSDP and
FSDP_CPU_RAM_EFFICIENT_LOADING), loads the model the way train_sft.py does (bitsandbytes
4-bit for QLoRA, no device_map), and writes one JSON line per case to OUT_DIR/rank<N>.jsonl
(a file per rank: two ranks printing to one pipe interleave their lines).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from transformers.integrations import HfDeepSpeedConfig

ZERO3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1, "train_batch_size": 2}
CASES = {
    "zero3-16bit": {"deepspeed": True},
    "zero3-4bit": {"deepspeed": True, "bits": 4},
    "fsdp-16bit-ram-efficient": {"fsdp": True},
    "fsdp-4bit": {"fsdp": True, "bits": 4},
}


def load(path: str, case: dict):
    kwargs = {"dtype": torch.float32}
    if case.get("bits") == 4:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32, bnb_4bit_quant_storage=torch.float32
        )
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def main() -> None:
    path, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = (out_dir / f"rank{rank}.jsonl").open("w", encoding="utf-8")
    for name, case in CASES.items():
        os.environ["ACCELERATE_USE_FSDP"] = os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = str(bool(case.get("fsdp")))
        ds_config = HfDeepSpeedConfig(ZERO3) if case.get("deepspeed") else None
        params = list(load(path, case).parameters())
        report = {
            "case": name,
            "rank": rank,
            "devices": sorted({p.device.type for p in params}),
            "zero_init": all(hasattr(p, "ds_id") for p in params),  # partitioned by deepspeed.zero.Init
            "quantized": sum(type(p).__name__ == "Params4bit" for p in params),
            "local_numel": sum(p.numel() for p in params),  # elements this rank holds
            "numel": sum(getattr(p, "ds_numel", p.numel()) for p in params),  # elements of the whole model
        }
        out.write(json.dumps(report) + "\n")
        del params, ds_config
        gc.collect()
        dist.barrier()
    out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
