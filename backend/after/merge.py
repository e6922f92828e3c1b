"""Merge a run's LoRA adapter into its base and save a standalone model. Imports torch: worker only.

The base is loaded in the chosen dtype without quantization, also for QLoRA runs: PEFT can merge
into 4-bit weights, but the result is rounded back to 4 bits and loses most of what the adapter
learned (PEFT's docs: "merging into 4-bit weights ... results in a loss of accuracy"); merged into
the 16-bit base, the model is exact and loads without bitsandbytes. Sharded ZeRO-3/FSDP
checkpoints are consolidated first (backend/after/consolidate.py).

The output folder gets model.safetensors, config.json, generation_config.json, the tokenizer,
adapter/ (the adapter itself, for vLLM's --enable-lora), serve.sh and tunedeck_merge.json (what
was merged). It is written under a hidden name and renamed: a failure leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from tunedeck.backend.render.serve import ADAPTER_SUBDIR, SERVE_FILE, render_serve_sh
from tunedeck.backend.runs.checkpoints import AfterError, Weights, base_model_path
from tunedeck.backend.spec import JobSpec

DTYPES = ("bfloat16", "float16", "float32")
PROVENANCE_FILE = "tunedeck_merge.json"


def check_output_dir(out_dir: Path) -> Path:
    """The resolved output folder; AfterError naming -o when it exists with files in it or cannot be made."""
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise AfterError(
            f"-o: {out_dir} already exists and is not an empty folder; choose a new folder for the merged model"
        )
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AfterError(
            f"-o: cannot create {out_dir.parent} ({exc.strerror or exc}); choose a folder you can write"
        ) from None
    return out_dir


@contextlib.contextmanager
def staged(out_dir: Path, what: str) -> Iterator[Path]:
    """A hidden folder beside out_dir to write into, renamed to out_dir (empty or absent: check_output_dir) when
    the block ends well and removed otherwise: a failure leaves nothing half-written. AfterError naming -o when
    the disk refuses."""
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        yield staging
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    except OSError as exc:
        raise AfterError(
            f"-o: writing {what} to {out_dir} failed ({exc.strerror or exc}); free space or choose another folder"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def merge_run(
    run_dir: Path, job: JobSpec, run_id: str, weights: Weights, out_dir: Path, dtype: str, device: str, progress=None
) -> dict:
    """Merge and save; returns what was written (out_dir, files, dtype, ...)."""
    from tunedeck.backend.after.model_load import load_base, load_tokenizer, with_adapter

    if dtype not in DTYPES:
        raise AfterError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if weights.is_base:
        raise AfterError("merge needs an adapter: drop --base")
    out_dir = check_output_dir(out_dir)
    say = progress or (lambda *a: None)
    steps = 5
    say(f"loading the base model in {dtype} (not quantized) on {device}", 0, steps)
    base = load_base(run_dir, job, device, quantized=False, dtype=dtype)
    say(f"loading {weights.describe()}", 1, steps)
    model = with_adapter(base, run_dir, job, weights, progress)
    with staged(out_dir, "the merged model") as staging:
        # The adapter as PEFT saves it (what vLLM's --lora-modules reads), before merging unloads it.
        model.save_pretrained(str(staging / ADAPTER_SUBDIR))
        say("merging the adapter into the weights", 2, steps)
        merged = model.merge_and_unload()
        say(f"saving to {out_dir}", 3, steps)
        merged.save_pretrained(staging)
        load_tokenizer(run_dir, job, weights).save_pretrained(staging)
        info = _provenance(run_dir, job, run_id, weights, dtype)
        (staging / PROVENANCE_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        serve = staging / SERVE_FILE
        serve.write_text(_serve_script(run_dir, job, run_id, dtype), encoding="utf-8")
        serve.chmod(0o755)
    say("done", steps, steps)
    return {**info, "out_dir": str(out_dir), "files": sorted(p.name for p in out_dir.iterdir())}


def _provenance(run_dir: Path, job: JobSpec, run_id: str, weights: Weights, dtype: str) -> dict:
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "weights": weights.name,
        "step": weights.step,
        "base_model": base_model_path(run_dir, job),
        "method": job.method,
        "merged_into": f"{dtype} base (not quantized)",
        "dtype": dtype,
        "merged_at": time.time(),
    }


def _serve_script(run_dir: Path, job: JobSpec, run_id: str, dtype: str) -> str:
    return render_serve_sh(
        base_model=base_model_path(run_dir, job),
        served_name=f"tunedeck-{run_id}",
        dtype=dtype,
        lora_rank=job.lora.r,
        max_model_len=job.dataset.max_seq_length,
    )
