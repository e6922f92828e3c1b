#!/usr/bin/env python
"""tunedeck's training entrypoint: TRL SFTTrainer under `accelerate launch`.

    accelerate launch --config_file accelerate_config.yaml train_sft.py \
        --job job.yaml --training-args training_args.yaml [--run-dir DIR]

This file ships in every exported bundle as train_sft.py, so it depends only on the
Hugging Face stack and PyYAML, never on tunedeck. job.yaml is read as a plain dict
(model, method, lora, quantization, dataset); training_args.yaml holds the keyword
arguments of trl.SFTConfig and is passed unchanged: what you read is what runs.

What it writes in the run folder (DIR, default the current folder; relative paths in
both YAML files are taken from there):
  metrics.jsonl     rank 0 only: {"event": "start"} with what the run actually got (world
                    size, accelerate's distributed type, ZeRO stage, FSDP, wrapped model
                    class, parameter counts), one {"event": "log"} per logging step, and
                    {"event": "end"} with the status (finished | stopped | failed)
  logs/rank<N>.log  each rank's stdout and stderr
  errors.jsonl      one line per rank that failed (rank, time, error, traceback)
  <output_dir>/     checkpoints and the final adapter or model

SIGTERM or SIGINT: every rank finishes its current step, a checkpoint is saved, the run
ends as "stopped".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import yaml

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
# Fault injection for testing the failure path: TUNEDECK_FAULT="rank=1,step=2" makes rank 1
# raise at the end of step 2. Unset in normal use.
FAULT_ENV = "TUNEDECK_FAULT"


class JobError(Exception):
    """A problem with the job's inputs, worded for the person who wrote the job."""


# ---------------------------------------------------------------- run folder plumbing


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def redirect_output(run_dir: Path, rank: int):
    """Send this process's stdout and stderr (Python and C level) to logs/rank<N>.log.

    Returns a text stream on the original terminal for rank 0 when it is one (someone ran
    launch.sh by hand), so they still see progress; otherwise None.
    """
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    terminal = None
    if rank == 0 and os.isatty(2):
        terminal = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    import faulthandler

    faulthandler.enable()  # a crash in C code still leaves a Python stack in the log
    if terminal:
        print(f"rank 0 logs to {logs / 'rank0.log'}, metrics to {run_dir / 'metrics.jsonl'}", file=terminal)
    return terminal


class JsonlWriter:
    """Appends one JSON object per line; each record is one write(), so readers never see half a line."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict) -> None:
        line = (json.dumps(record, default=_json_default) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _json_default(value):
    if hasattr(value, "item"):  # tensors and numpy scalars
        return value.item()
    return str(value)


class StopRequest:
    """Set by SIGTERM/SIGINT; the training loop acts on it at the next step boundary."""

    def __init__(self):
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            print(f"received {signal.Signals(signum).name}: stopping after the current step", flush=True)
        self.requested = True


# ---------------------------------------------------------------- inputs


def read_yaml(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"{what} ({path}) cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise JobError(f"{what} ({path}) is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise JobError(f"{what} ({path}) must be a YAML mapping")
    return data


def torch_dtype(name: str):
    import torch

    try:
        return getattr(torch, name)
    except AttributeError:
        raise JobError(f"model.dtype: unknown dtype {name!r}; use bfloat16, float16 or float32") from None


def quantization_config(job: dict):
    """BitsAndBytesConfig from job.quantization (its keys are BitsAndBytesConfig's, plus `bits`)."""
    quant = dict(job.get("quantization") or {})
    bits = quant.pop("bits", None)
    if not bits:
        return None
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    if bits != 4:
        raise JobError(f"quantization.bits: {bits} is not supported; use 4 or 8")
    quant["bnb_4bit_compute_dtype"] = torch_dtype(quant.get("bnb_4bit_compute_dtype", "bfloat16"))
    return BitsAndBytesConfig(load_in_4bit=True, **quant)


def load_model(job: dict, args):
    from transformers import AutoModelForCausalLM

    model_cfg = job.get("model") or {}
    bnb = quantization_config(job)
    kwargs = {
        "dtype": torch_dtype(model_cfg.get("dtype", "float32")),
        "attn_implementation": model_cfg.get("attn_implementation") or "sdpa",
        "trust_remote_code": bool(model_cfg.get("trust_remote_code", False)),
    }
    if model_cfg.get("revision"):
        kwargs["revision"] = model_cfg["revision"]
    if bnb is not None:
        # A quantized model is placed at load time, each rank on its own device.
        kwargs["quantization_config"] = bnb
        kwargs["device_map"] = {"": str(args.device)}
    model = AutoModelForCausalLM.from_pretrained(model_cfg["name_or_path"], **kwargs)
    if bnb is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(args.activation_checkpointing),
            gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs,
        )
    return model


def load_tokenizer(job: dict):
    from transformers import AutoTokenizer

    model_cfg = job.get("model") or {}
    tokenizer = AutoTokenizer.from_pretrained(
        model_cfg["name_or_path"],
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        revision=model_cfg.get("revision") or None,
    )
    if tokenizer.pad_token is None:  # many base models ship without one; padding needs it
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def peft_config(job: dict):
    if job.get("method", "lora") not in ("lora", "qlora"):
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **(job.get("lora") or {}))


def load_split(dataset_cfg: dict, split: str):
    """One split of a local JSON/JSONL/CSV/Parquet file or folder, or of a hub dataset."""
    from datasets import load_dataset

    source = str(dataset_cfg["path"])
    path = Path(source).expanduser()
    if path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise JobError(
                f"dataset.path: {path} is not a .json, .jsonl, .csv or .parquet file; convert it or point to a folder"
            )
        return load_dataset(builder, data_files=str(path), split=split)
    if path.is_dir():
        return load_dataset(str(path), split=split)
    if source.startswith(("/", "./", "../", "~")) or path.suffix.lower() in DATA_FILE_BUILDERS:
        raise JobError(f"dataset.path: {source} does not exist (looked from {Path.cwd()}); fix the path")
    return load_dataset(source, dataset_cfg.get("name"), split=split)


def _require_columns(dataset, needed: dict[str, str]) -> None:
    """needed: spec field name -> column name."""
    missing = {field: col for field, col in needed.items() if col not in dataset.column_names}
    if missing:
        field, col = next(iter(missing.items()))
        raise JobError(
            f"dataset.{field}: column {col!r} is not in the dataset (columns: {', '.join(dataset.column_names)}); "
            f"set dataset.{field} to the right column or change dataset.format"
        )


def to_trl_format(dataset, dataset_cfg: dict, text_column: str):
    """Map the spec's four formats onto what SFTTrainer reads: text, prompt/completion or messages."""
    fmt = dataset_cfg.get("format", "text")
    field = lambda name, default: dataset_cfg.get(name) or default  # noqa: E731
    if fmt == "text":
        col = field("text_field", "text")
        _require_columns(dataset, {"text_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, text_column) if col != text_column else dataset
    if fmt == "prompt-completion":
        prompt, completion = field("prompt_field", "prompt"), field("completion_field", "completion")
        _require_columns(dataset, {"prompt_field": prompt, "completion_field": completion})
        dataset = dataset.select_columns([prompt, completion])
        return dataset.rename_columns({c: n for c, n in ((prompt, "prompt"), (completion, "completion")) if c != n})
    if fmt == "messages":
        col = field("messages_field", "messages")
        _require_columns(dataset, {"messages_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, "messages") if col != "messages" else dataset
    if fmt == "alpaca":
        instruction, given, output = (
            field("instruction_field", "instruction"),
            field("input_field", "input"),
            field("output_field", "output"),
        )
        _require_columns(dataset, {"instruction_field": instruction, "output_field": output})
        has_input = given in dataset.column_names

        def convert(example):
            extra = (example[given] or "").strip() if has_input else ""
            template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
            return {
                "prompt": template.format(instruction=example[instruction].strip(), input=extra),
                "completion": str(example[output]),
            }

        return dataset.map(convert, remove_columns=dataset.column_names)
    raise JobError(f"dataset.format: {fmt!r} is not one of text, prompt-completion, messages, alpaca")


def load_datasets(job: dict, args, tokenizer):
    dataset_cfg = job.get("dataset") or {}
    if dataset_cfg.get("format") == "messages" and not tokenizer.chat_template:
        raise JobError(
            f"dataset.format: messages needs a chat template, and the tokenizer of {job['model']['name_or_path']} "
            "has none; use a chat model or the prompt-completion format"
        )
    train = to_trl_format(load_split(dataset_cfg, dataset_cfg.get("split") or "train"), dataset_cfg, args.dataset_text_field)
    evaluation = None
    if dataset_cfg.get("eval_split"):
        evaluation = to_trl_format(load_split(dataset_cfg, dataset_cfg["eval_split"]), dataset_cfg, args.dataset_text_field)
    return train, evaluation


# ---------------------------------------------------------------- what the run actually got


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total), counting ZeRO-3 partitioned and 4-bit packed parameters at full size (as PEFT does)."""
    trainable = total = 0
    for param in model.parameters():
        n = param.ds_numel if hasattr(param, "ds_numel") else param.numel()
        if param.__class__.__name__ == "Params4bit":
            n *= 2 * param.element_size()  # two 4-bit values per byte of storage
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total


def describe_run(trainer, job: dict) -> dict:
    """The start record: facts read from the live objects, not from the config that asked for them."""
    import torch.distributed as dist

    wrapped = trainer.model_wrapped
    zero_stage = None
    if trainer.is_deepspeed_enabled:
        engine = trainer.deepspeed or wrapped
        zero_stage = int(engine.zero_optimization_stage())
    fsdp = bool(trainer.is_fsdp_enabled) or _has_fsdp_modules(wrapped)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    trainable, total = count_parameters(trainer.model)
    quantized: dict[str, int] = {}
    for module in trainer.model.modules():
        if type(module).__module__.startswith("bitsandbytes"):
            quantized[type(module).__name__] = quantized.get(type(module).__name__, 0) + 1
    return {
        "event": "start",
        "time": time.time(),
        "world_size": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "zero_stage": zero_stage,
        "fsdp": fsdp,
        "model_class": type(wrapped).__name__,
        "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
        "device": str(trainer.args.device),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "method": job.get("method", "lora"),
        "quantized_modules": quantized,  # bitsandbytes layers actually in the model: {"Linear4bit": 21}
        "trainable_params": trainable,
        "total_params": total,
        "max_steps": trainer.state.max_steps,
        "resumed_from_step": trainer.state.global_step or None,
    }


def _has_fsdp_modules(model) -> bool:
    from torch.distributed import fsdp

    classes = tuple(c for c in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None)) if c)
    return any(isinstance(m, classes) for m in model.modules())


def gpu_peaks_gb() -> tuple[list[float], list[float]] | None:
    """Peak allocated / reserved GPU memory of every rank (a collective: all ranks call it), or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    import torch.distributed as dist

    mine = [torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    return [round(m[0], 3) for m in everyone], [round(m[1], 3) for m in everyone]


# ---------------------------------------------------------------- the callback


def make_callback(metrics: JsonlWriter | None, stop: StopRequest, job: dict, terminal):
    from transformers import TrainerCallback

    class RunRecorder(TrainerCallback):
        """Writes the start/log records and turns a stop request into save-and-stop at a step boundary."""

        def __init__(self):
            self.trainer = None
            self.stopped_early = False
            self._last_log = (time.time(), 0)
            self._step_end = 0.0
            self._fault = _parse_fault(os.environ.get(FAULT_ENV))

        def on_train_begin(self, args, state, control, **kwargs):
            self._last_log = (time.time(), 0)
            if metrics:
                metrics.write(describe_run(self.trainer, job))

        def on_step_end(self, args, state, control, **kwargs):
            self._step_end = time.time()  # evaluation, when due, runs after this
            if self._fault and self._fault == (global_rank(), state.global_step):
                raise RuntimeError(f"fault injected by {FAULT_ENV} on rank {global_rank()} at step {state.global_step}")
            # Ranks get the signal at slightly different moments: agree, or one rank would wait forever.
            if _any_rank(stop.requested, args.device):
                if state.global_step < state.max_steps:
                    self.stopped_early = True
                control.should_save = True
                control.should_log = True
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if "loss" not in logs and "eval_loss" not in logs:
                return  # the trainer's closing summary; the end record covers it
            peaks = gpu_peaks_gb()  # collective: every rank takes part
            if not metrics:
                return
            record = {"event": "log", "time": time.time(), "step": state.global_step, "max_steps": state.max_steps}
            record["epoch"] = logs.get("epoch", state.epoch)
            if "loss" in logs:
                now, tokens = time.time(), logs.get("num_tokens")
                last_time, last_tokens = self._last_log
                if tokens is not None and now > last_time:
                    record["tokens_per_second"] = (tokens - last_tokens) / (now - last_time)
                    self._last_log = (now, tokens)
                for key in ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "num_tokens"):
                    if key in logs:
                        record[key] = logs[key]
            else:
                # Evaluation trains no tokens: leave its time out of the next tokens/s window.
                last_time, last_tokens = self._last_log
                self._last_log = (last_time + time.time() - max(self._step_end, last_time), last_tokens)
            for key in ("eval_loss", "eval_mean_token_accuracy"):
                if key in logs:
                    record[key] = logs[key]
            if peaks:
                record["gpu_peak_allocated_gb"], record["gpu_peak_reserved_gb"] = peaks
            metrics.write(record)
            if terminal:
                shown = "  ".join(f"{k} {record[k]:.4g}" for k in ("loss", "eval_loss", "learning_rate") if k in record)
                print(f"step {record['step']}/{record['max_steps']}  {shown}", file=terminal)

    return RunRecorder()


def _any_rank(flag: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    tensor = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _parse_fault(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = dict(item.split("=", 1) for item in text.split(","))
    return int(parts["rank"]), int(parts["step"])


# ---------------------------------------------------------------- main


def resume_checkpoint(args, job: dict) -> str | None:
    """The newest checkpoint in output_dir when resuming was asked for, else None (a fresh start)."""
    wanted = args.resume_from_checkpoint or (job.get("training") or {}).get("resume_from_checkpoint")
    if not wanted:
        return None
    if isinstance(wanted, str) and wanted.lower() not in ("true", "last"):
        return wanted
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if found is None:  # a first run (or a requeued job that never saved): say so, the step count starts at 0
        print(f"resume_from_checkpoint: no checkpoint in {os.path.abspath(args.output_dir)}; starting from step 0", flush=True)
    return found


def train(job: dict, training_args: dict, metrics, stop: StopRequest, terminal) -> str:
    """Run the job; returns "finished" or "stopped"."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(**training_args)
    tokenizer = load_tokenizer(job)
    model = load_model(job, args)
    train_set, eval_set = load_datasets(job, args, tokenizer)
    recorder = make_callback(metrics, stop, job, terminal)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=peft_config(job),
        callbacks=[recorder],
    )
    recorder.trainer = trainer
    trainer.train(resume_from_checkpoint=resume_checkpoint(args, job))
    if recorder.stopped_early:
        return "stopped"
    if trainer.is_fsdp_enabled:
        # Trainer.save_model writes nothing under FSDP unless the state dict is FULL (checkpoints
        # may stay sharded): gather the final adapter/model into one loadable file.
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model()  # every rank calls it (ZeRO-3 and FSDP gather); only rank 0 writes
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.output_dir)
    return "finished"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=Path("job.yaml"), help="job spec YAML (default job.yaml)")
    parser.add_argument(
        "--training-args", type=Path, default=Path("training_args.yaml"), help="trl.SFTConfig kwargs YAML"
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="run folder (default: the current folder)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    job_path, args_path = args.job.resolve(), args.training_args.resolve()
    run_dir = (args.run_dir or Path.cwd()).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(run_dir)  # relative paths (output_dir, data files) are from the run folder
    rank = global_rank()
    stop = StopRequest()
    stop.install()
    terminal = redirect_output(run_dir, rank)
    metrics = JsonlWriter(run_dir / "metrics.jsonl") if rank == 0 else None
    started = time.time()
    status, error = "failed", None
    try:
        job = read_yaml(job_path, "job spec")
        training_args = read_yaml(args_path, "training arguments")
        status = train(job, training_args, metrics, stop, terminal)
    except BaseException as exc:  # noqa: BLE001 - every failure must end the run's record
        if isinstance(exc, JobError):  # the user's input: the message says it all
            error, trace = str(exc), None
            print(f"error: {error}", file=sys.stderr)
        else:
            error, trace = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__), traceback.format_exc()
            traceback.print_exc()
        JsonlWriter(run_dir / "errors.jsonl").write({"rank": rank, "time": time.time(), "error": error, "traceback": trace})
    if metrics:
        metrics.write(
            {"event": "end", "time": time.time(), "status": status, "runtime_s": time.time() - started, "error": error}
        )
    if terminal:
        print(f"run {status}" + (f": {error}" if error else ""), file=terminal)
    _close_process_group(clean=status != "failed")
    return 0 if status != "failed" else 1


def _close_process_group(clean: bool) -> None:
    # Without the barrier, ranks tearing down at different moments occasionally abort at exit.
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
