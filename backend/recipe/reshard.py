"""A ZeRO checkpoint saved on another number of processes, made loadable here: DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds the optimizer state in one shard per data-parallel process
(checkpoint-N/global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt), and DeepSpeed loads it only on as many
processes ("The checkpoint being loaded used a DP world size of 2 but the current world size is 1"). Its universal
form holds each parameter's weights and optimizer state whole, which any number of processes loads. So when a run
resumes a ZeRO checkpoint on another data-parallel size, rank 0 converts it with DeepSpeed's own converter
(`python -m deepspeed.checkpoint.ds_to_universal`) into global_stepN_universal beside it and names that in
latest_universal, as DeepSpeed's engine looks for it, while the other ranks wait; then the engine is told to load
it (the DeepSpeed config's checkpoint.load_universal). The conversion is written under a temporary name and renamed
when complete, and done once: a later resume on the same shape finds it.

accelerate's layout is what DeepSpeed#5405 trips on (its converter was run on the checkpoint folder instead of
global_stepN, and without the universal-checkpoint info that Megatron writes and accelerate does not):
`--inject_missing_state` supplies that info, and the input is the global_stepN folder the `latest` file names.

FSDP needs none of this: accelerate saves FSDP's sharded state with torch.distributed.checkpoint
(pytorch_model_fsdp_0/, optimizer_0/), which reshards onto the processes that load it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

UNIVERSAL_LATEST = "latest_universal"  # the file DeepSpeed's engine reads the universal tag from


def saved_on(checkpoint: str | Path) -> int | None:
    """The data-parallel size a ZeRO checkpoint was saved on (its optimizer shards); None when it is not one."""
    folder = zero_folder(checkpoint)
    if folder is None:
        return None
    shards = list(folder.glob("*zero_pp_rank_*_mp_rank_00_optim_states.pt"))
    return len(shards) or None


def zero_folder(checkpoint: str | Path) -> Path | None:
    """checkpoint-N/global_stepN, as the checkpoint's `latest` file names it; None without one."""
    latest = Path(checkpoint) / "latest"
    try:
        tag = latest.read_text().strip()
    except OSError:
        return None
    folder = Path(checkpoint) / tag
    return folder if tag and folder.is_dir() else None


def load_universal_if_reshaped(trainer, checkpoint: str | None, data_parallel: int) -> int | None:
    """When `checkpoint` is a ZeRO checkpoint saved on another data-parallel size, make its universal form (rank 0;
    the others wait) and have the DeepSpeed engine load that. Returns the size it was saved on, or None when
    nothing was needed (no checkpoint, not DeepSpeed, the same size)."""
    if not checkpoint or not trainer.is_deepspeed_enabled:
        return None
    saved = saved_on(checkpoint)
    if saved is None or saved == data_parallel:
        return None
    accelerator = trainer.accelerator
    with accelerator.main_process_first():  # rank 0 converts; every other rank enters when it is done
        if accelerator.is_main_process:
            convert_to_universal(Path(checkpoint))
    if not (Path(checkpoint) / UNIVERSAL_LATEST).is_file():  # a rank that does not see rank 0's disk
        raise RuntimeError(
            f"{checkpoint}: the universal checkpoint rank 0 wrote is not here: resuming on another number of "
            "processes needs output_dir on a disk every machine shares"
        )
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config.setdefault("checkpoint", {})["load_universal"] = True  # read as the engine is built, in train()
    return saved


def convert_to_universal(checkpoint: Path) -> Path:
    """checkpoint/global_stepN -> checkpoint/global_stepN_universal (once), named in checkpoint/latest_universal."""
    source = zero_folder(checkpoint)
    if source is None:
        raise RuntimeError(f"{checkpoint} holds no DeepSpeed checkpoint (no `latest` file naming one)")
    target = source.with_name(f"{source.name}_universal")
    if not target.is_dir():
        partial = source.with_name(f"{target.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)  # a conversion cut short before
        print(f"converting {source} to a universal checkpoint for another number of processes", flush=True)
        command = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(source),
            "--output_folder",
            str(partial),
            "--inject_missing_state",  # accelerate does not write the info Megatron does (DeepSpeed#5405)
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ]
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(result.stdout[-4000:], flush=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"DeepSpeed's universal-checkpoint converter failed on {source} (exit {result.returncode}): resume "
                "on the number of processes the checkpoint was saved on"
            )
        os.replace(partial, target)
    (checkpoint / UNIVERSAL_LATEST).write_text(target.name)
    return target
