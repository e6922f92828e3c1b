"""Smoke run: a job's exact path, proven in a minute before it spends GPU hours.

    smoke_spec(spec, gpus=0) -> JobSpec      the job to run instead (`tunedeck train SPEC --smoke`)
    smoke_verdict(run_dir) -> Verdict         passed or not, in one line, from what the run wrote

The smoke job keeps everything that decides whether a job's load -> wrap -> step path works:
strategy (ZeRO stage and offload, FSDP version, wrap class and activation checkpointing),
method, LoRA targets, quantization and its storage dtype, model dtype, dataset format and
chat template, gradient checkpointing. It changes only the size: the model becomes a
2-layer random-weight model of the same architecture (same module names, so target_modules
and the FSDP layer class apply), built from the catalog or the model's local config.json;
the data a few rows of the job's dataset (the demo data in the job's format when the
dataset is not on this machine); a few steps; 2 CPU ranks, or the job's GPUs. What the CPU
cannot do is swapped for what it can (DeepSpeed refuses bf16 and fp16 on CPU: fp32).

Building the tiny model imports torch, so it runs in a subprocess (`python -m tunedeck.backend.runs.smoke`):
the panel may call smoke_spec and stays light.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tunedeck.backend.recipe.vocabulary import column_fields
from tunedeck.backend.runs.job_file import UnreadableJob
from tunedeck.backend.runs.records import read_records
from tunedeck.backend.runs.summary import Verdict, verdict
from tunedeck.backend.spec import PACKAGE_DIR, JobSpec, catalog, demo_home, set_paths
from tunedeck.backend.spec.mix import mix_sources

STEPS = 3
MIX_ROWS = 8  # of each dataset.mix source
ROWS = 64  # of the job's dataset: enough for STEPS x accumulation x batch x ranks on 2 CPU ranks
MAX_SEQ_LENGTH = 128
CPU_RANKS = 2
# The tiny model: 2 layers, 4 heads of 16, same architecture and module names as the job's.
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "intermediate_size": 128}
# bitsandbytes optimizers run on CUDA only.
GPU_ONLY_OPTIMIZERS = ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")


class SmokeError(ValueError):
    """The job cannot be smoke-tested as it is; the message names the field and the fix."""


# ---------------------------------------------------------------- the smoke job


def smoke_spec(spec: JobSpec, gpus: int = 0) -> JobSpec:
    """The job on a tiny model of its architecture, a few rows, a few steps, on 2 CPU ranks (gpus=0) or its GPUs.

    Builds the tiny model once (cached under $TUNEDECK_HOME/smoke). Raises SmokeError.
    """
    from tunedeck.backend.spec import SpecError

    model_dir = ensure_tiny_model(spec)
    t, d = spec.training, spec.dataset
    changes = {
        "model.name_or_path": str(model_dir),
        "model.revision": None,
        "model.trust_remote_code": False,  # the tiny model is built from transformers' own classes
        "training.max_steps": STEPS,
        "training.logging_steps": 1,
        "training.save_steps": STEPS,  # one checkpoint: the strategy's save path runs too
        "training.save_total_limit": 1,
        "training.eval_steps": STEPS if d.eval_split else None,
        "training.per_device_train_batch_size": min(t.per_device_train_batch_size, 2),
        "training.per_device_eval_batch_size": min(t.per_device_eval_batch_size, 2),
        "training.gradient_accumulation_steps": min(t.gradient_accumulation_steps, 2),
        "training.report_to": "none",
        "training.resume_from_checkpoint": False,
        "dataset.max_seq_length": min(d.max_seq_length, MAX_SEQ_LENGTH),
        "output_dir": "output",  # inside the run folder: never the job's real output
        **_smoke_generation(spec),
        **_smoke_data(spec),
        **(_on_gpus(spec, gpus) if gpus else _on_cpu(spec)),
    }
    try:
        return set_paths(spec, changes)
    except SpecError as exc:  # a field the smoke run sets is refused: say which
        raise SmokeError(str(exc)) from None


def _smoke_generation(spec: JobSpec) -> dict:
    """GRPO: groups of 2 short answers (a group fits the smoke run's small batches), the job's rewards kept."""
    if spec.objective != "grpo":
        return {}
    return {"grpo.num_generations": 2, "grpo.max_completion_length": min(spec.grpo.max_completion_length, 8)}


def _smoke_data(spec: JobSpec) -> dict:
    d = spec.dataset
    if Path(d.path).expanduser().exists():
        return {
            "dataset.split": _first_rows(d.split),
            "dataset.eval_split": d.eval_split and _first_rows(d.eval_split, 16),
            "dataset.mix": _smoke_mix(d.mix, None),
        }
    # A hub dataset cannot be fetched here: the demo task in the job's format, under the default column names.
    from tunedeck.backend.data.demo import ensure_demo

    try:
        home = ensure_demo()
    except RuntimeError as exc:
        raise SmokeError(f"dataset.path: {d.path} is not here, and the demo data could not be built: {exc}") from None
    columns = {f"dataset.{name}": column.default for name, (column, _) in column_fields().items()}
    return {
        "dataset.path": str(home / "formats" / f"{d.format}.jsonl"),
        "dataset.name": None,
        "dataset.split": f"train[:{ROWS}]",
        "dataset.eval_split": "train[-16:]" if d.eval_split else None,
        "dataset.mix": _smoke_mix(d.mix, home / "formats" / f"{d.format}.jsonl"),
        **columns,
    }


def _smoke_mix(entries: list[str], demo_file: Path | None) -> list[str]:
    """dataset.mix at toy scale: MIX_ROWS rows of each local source; a hub source (not fetched here) becomes the
    demo data when the job's own dataset did (demo_file), and is left out otherwise (its columns are the job's)."""
    out = []
    for source in mix_sources(entries):
        local = Path(source.path).expanduser().exists()
        path = source.path if local else demo_file
        if path is not None:  # a local source is read without a hub configuration (train.py's load_split)
            out.append(f"{path}:{source.split if local else 'train'}#{MIX_ROWS}")
    return list(dict.fromkeys(out))  # two hub sources become the same demo entry: once


def _first_rows(split: str, rows: int = ROWS) -> str:
    """The first rows of a split: "train" or "train[:95%]" -> "train[:64]"."""
    return f"{split.split('[', 1)[0]}[:{rows}]"


def _on_cpu(spec: JobSpec) -> dict:
    t = spec.training
    changes = {
        "launch.use_cpu": True,
        "launch.num_processes": CPU_RANKS,
        "launch.num_machines": 1,
        "launch.machine_rank": 0,
        "launch.main_process_ip": None,
        "launch.gpu_ids": "all",
    }
    if spec.strategy.is_deepspeed or t.precision == "fp16":
        # DeepSpeed on CPU refuses bf16 and fp16; CPU autocast has no fp16 (docs/notes/cpu-distributed.md).
        changes["training.precision"] = "fp32"
    if t.optim in GPU_ONLY_OPTIMIZERS:
        changes["training.optim"] = "adamw_torch"
    if spec.model.attn_implementation == "flash_attention_2":
        changes["model.attn_implementation"] = "sdpa"
    return changes


def _on_gpus(spec: JobSpec, gpus: int) -> dict:
    # This machine's GPUs, up to as many as the job puts on one machine; the job's precision stays.
    return {
        "launch.use_cpu": False,
        "launch.num_processes": max(1, min(spec.launch.processes_per_machine, gpus)),
        "launch.num_machines": 1,
        "launch.machine_rank": 0,
        "launch.main_process_ip": None,
        "launch.gpu_ids": "all",
    }


def start_smoke_run(manager, spec: JobSpec) -> str:
    """Validate the job, start its smoke run in the manager's runs folder, return the run id.

    What `tunedeck train SPEC --smoke` and the panel's Smoke test button call. Raises SmokeError
    (the job, or its smoke version, has errors: every problem is in the message) or RunError.
    """
    from tunedeck.backend.runs.preflight import gpu_indices
    from tunedeck.backend.validate import validate

    errors = [p for p in validate(spec) if p.level == "error"]
    if errors:
        raise SmokeError("the job has errors:\n" + "\n".join(f"- {p.field}: {p.message}" for p in errors))
    smoke = smoke_spec(spec, gpus=0 if spec.launch.use_cpu else len(gpu_indices()))
    errors = [p for p in validate(smoke) if p.level == "error"]
    if errors:
        where = "on GPUs" if not smoke.launch.use_cpu else "on CPU processes"
        raise SmokeError(
            f"the job cannot be smoke-tested {where}:\n" + "\n".join(f"- {p.field}: {p.message}" for p in errors)
        )
    return manager.start(smoke)


def is_smoke_job(job: JobSpec | UnreadableJob) -> bool:
    """A run's job is a smoke run's: its model is one of the tiny models."""
    return isinstance(job, JobSpec) and Path(job.model.name_or_path).expanduser().parent == smoke_home()


# ---------------------------------------------------------------- the tiny model


def smoke_home() -> Path:
    """Where tiny models are cached: next to the demo ($TUNEDECK_HOME/smoke)."""
    return demo_home().parent / "smoke"


def tiny_model_request(spec: JobSpec) -> tuple[dict, Path]:
    """(config.json of the tiny model without its vocabulary, tokenizer folder) for the job's model."""
    source = spec.model.name_or_path
    folder = Path(source).expanduser()
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SmokeError(f"model.name_or_path: {folder / 'config.json'} cannot be read: {exc}") from None
        # The model's own tokenizer, when it ships one: its chat template is part of the path.
        has_tokenizer = any(
            (folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
        )
        tokenizer = folder if has_tokenizer else _demo_tokenizer()
    else:
        arch = catalog.lookup(source)
        if arch is None:
            raise SmokeError(
                f"model.name_or_path: the architecture of {source!r} is unknown here (not in tunedeck's catalog, and "
                "no local folder with a config.json): point model.name_or_path at a local copy of the model (its "
                "config.json is enough), or use a catalog model (`tunedeck estimate` lists what it knows)"
            )
        config = _config_from_arch(arch)
        tokenizer = _demo_tokenizer()
    return _shrink(config), tokenizer


def _demo_tokenizer() -> Path:
    from tunedeck.backend.data.demo import ensure_demo

    try:
        return ensure_demo() / "model"
    except RuntimeError as exc:
        raise SmokeError(f"the demo tokenizer could not be built: {exc}") from None


def _config_from_arch(arch: catalog.ModelArch) -> dict:
    config = {
        "model_type": arch.model_type,
        "num_hidden_layers": arch.num_hidden_layers,
        "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "intermediate_size": arch.intermediate_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": arch.attention_bias,
    }
    if arch.num_local_experts:
        config.update(num_local_experts=arch.num_local_experts, num_experts_per_tok=arch.num_experts_per_tok)
    if arch.final_logit_softcapping is not None:
        config["final_logit_softcapping"] = arch.final_logit_softcapping
    return config


def _shrink(config: dict) -> dict:
    """Same architecture and module names, tiny sizes. Multi-head, grouped-query or multi-query attention stays so."""
    config = {
        k: v for k, v in config.items() if k not in ("quantization_config", "dtype", "torch_dtype", "_name_or_path")
    }
    heads = config.get("num_attention_heads") or 1
    kv_heads = config.get("num_key_value_heads") or heads
    config.update(TINY)
    config["num_key_value_heads"] = TINY["num_attention_heads"] if kv_heads == heads else min(kv_heads, 2)
    if isinstance(config.get("layer_types"), list):  # per-layer attention kinds (Gemma 2, Qwen 3)
        config["layer_types"] = config["layer_types"][: TINY["num_hidden_layers"]]
    if config.get("num_local_experts"):
        config["num_local_experts"] = min(config["num_local_experts"], 4)
        config["num_experts_per_tok"] = min(config.get("num_experts_per_tok") or 1, 2)
    return config


def ensure_tiny_model(spec: JobSpec) -> Path:
    """The tiny model's folder (config, random weights, tokenizer), built once in a subprocess."""
    config, tokenizer = tiny_model_request(spec)
    key = hashlib.sha256(
        json.dumps([config, str(tokenizer.resolve()), _tokenizer_stamp(tokenizer)], sort_keys=True).encode()
    )
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec.model.name_or_path.rstrip("/")).name)[:60] or "model"
    target = smoke_home() / f"{name}-{key.hexdigest()[:10]}"
    if (target / "config.json").is_file():
        return target
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunedeck.backend.runs.smoke",
            "--config",
            json.dumps(config),
            "--tokenizer",
            str(tokenizer),
        ]
        + ["--out", str(target)],
        cwd=PACKAGE_DIR,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "CUDA_VISIBLE_DEVICES": ""},
    )
    if result.returncode != 0 or not (target / "config.json").is_file():
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        kind = config.get("model_type", "?")
        raise SmokeError(f"model.name_or_path: a tiny {kind} model could not be built from its config:\n{tail}")
    return target


def _tokenizer_stamp(folder: Path) -> list:
    return sorted((p.name, p.stat().st_mtime_ns) for p in folder.glob("tokenizer*") if p.is_file())


def build_tiny_model(config: dict, tokenizer_dir: Path, out: Path) -> None:
    """Random weights of the config, with the tokenizer's vocabulary. Imports torch: call in a subprocess."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = dict(config, vocab_size=len(tokenizer))
    for name in ("bos", "eos", "pad"):
        token_id = getattr(tokenizer, f"{name}_token_id")
        if token_id is not None:
            config[f"{name}_token_id"] = token_id
    model_type = config.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
    staging = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(out)
    except OSError:  # built meanwhile by another smoke run
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- the verdict


def smoke_verdict(run_dir: Path) -> Verdict:
    """Passed when the run finished (the sanity gate included) and every logged loss is finite."""
    return verdict(read_records(run_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build a tiny random-weight model from a shrunk config.json (for smoke runs)."
    )
    parser.add_argument("--config", required=True, help="the tiny config as JSON (model_type and sizes)")
    parser.add_argument("--tokenizer", required=True, type=Path, help="folder of the tokenizer to use")
    parser.add_argument("--out", required=True, type=Path, help="folder to create")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    build_tiny_model(json.loads(args.config), args.tokenizer, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
