#!/usr/bin/env python
"""tunedeck's training entrypoint: TRL's SFTTrainer (DPOTrainer, KTOTrainer, GRPOTrainer) under `accelerate launch`.

    accelerate launch --config_file accelerate_config.yaml train_sft.py \
        --job job.yaml --training-args training_args.yaml [--run-dir DIR]

This file ships in every exported bundle as train_sft.py, so it depends only on the
Hugging Face stack and PyYAML, never on tunedeck. job.yaml is read as a plain dict
(model, method, objective, lora, quantization, dataset, grpo); training_args.yaml holds the keyword
arguments of trl.SFTConfig (DPOConfig, KTOConfig, GRPOConfig by objective) and is passed unchanged: what
you read is what runs.
It is one long file on purpose (like torchtune's recipes): a bundle must run with this
file alone. Its sections: run folder plumbing, inputs (model, tokenizer, data), what the
run actually got, the sanity gate, the callback that records it all, main.

Before its first step every run passes a sanity gate: it compares what it got with
job.yaml and stops every rank on a difference ("asked 2 processes on 1 machine, got 1").

What it writes in the run folder (DIR, default the current folder; relative paths in
both YAML files are taken from there):
  metrics.jsonl     rank 0 only: {"event": "start"} with what the run actually got (world
                    size, each rank's node, accelerate's distributed type, ZeRO stage, FSDP
                    version, wrapped model class, 4-bit modules, parameter counts, memory
                    peaks after loading, the gate's verdict, the GPU's peak TFLOPS or why MFU is not
                    defined), one {"event": "log"} per logging step (with mfu and hfu when the peak
                    is known), and
                    {"event": "end"} with the status (finished | stopped | failed)
  startup.json      rank 0: {"host", "phases": [{"phase", "at"}]}: each phase before its first step
                    (loading the model, tokenizing the data, ...) as it begins, "training" last; every
                    other rank writes its own to logs/rank<N>.startup.json
  progress.json     rank 0 only: {"step", "micro", "time", "saving"}: its last finished step and
                    micro-batch, rewritten as each ends: tunedeck's supervisor calls a run stalled
                    when it stops changing
  logs/rank<N>.log  each rank's stdout and stderr; SIGUSR1 makes a rank write every thread's
                    Python stack there (`tunedeck runs stacks` sends it), as its stall watchdog does
  answers.jsonl     rank 0 only, GRPO: at each logging step the answers the model just wrote to two
                    prompts, each with its rewards and advantage ({"step", "groups": [{"prompt",
                    "answers": [{"text", "rewards", "advantage"}]}]})
  errors.jsonl      one line per rank that failed (rank, time, error, traceback)
  <output_dir>/     checkpoints and the final adapter or model

SIGTERM or SIGINT: every rank finishes its current step, a checkpoint is saved, the run
ends as "stopped".

With TUNEDECK_NOTIFY_URL set (a Slack, Discord or Teams incoming webhook, an ntfy topic, any
endpoint of yours), rank 0 POSTs how the run ended there as JSON ({"text", "content", "run",
"state", "step", "max_steps", "loss", "error", "runtime_s"}) once its end record is written, within
10 s all told; an environment variable, not a job field, because such URLs are secrets and job files
travel. tunedeck's supervisor keeps the variable from the ranks and posts itself, after the run's
final state (a rank 0 killed outright, by the OOM killer, sends nothing).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import faulthandler
import functools
import importlib.util
import inspect
import json
import math
import numbers
import os
import random
import re
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import yaml

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
NOTIFY_ENV = "TUNEDECK_NOTIFY_URL"
# The whole POST (connecting, sending, the answer): urllib's timeout bounds each socket read alone, and a webhook
# answering a byte a second held a finished run open for ever.
NOTIFY_DEADLINE_S = 10
# Fault injection for testing the failure path: TUNEDECK_FAULT="rank=1,step=2" makes rank 1 raise at the end of
# step 2 (step 0: as training begins); "rank=*,step=0,exit=0" makes every rank leave then with os._exit(0), without
# a word, as user code may; "rank=1,seconds=20,phase=loading the model" makes rank 1 a slow node. Unset in normal use.
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
    faulthandler.enable()  # a crash in C code still leaves a Python stack in the log
    # Where is a stuck rank? `kill -USR1 PID` (or tunedeck, when the run stalls) writes every thread's stack here.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    show_each_warning_once()
    if terminal:
        print(f"rank 0 logs to {logs / 'rank0.log'}, metrics to {run_dir / 'metrics.jsonl'}", file=terminal)
    return terminal


def show_each_warning_once() -> None:
    """Print each distinct warning once per process, however often the libraries raise it.

    Python's own once-per-place rule forgets what it showed whenever any code enters
    warnings.catch_warnings, which the stack does every step: under ZeRO-3 DeepSpeed's calls of
    collectives torch deprecated printed one FutureWarning per step and per rank, half the lines of a
    rank log. warnings.showwarning is the documented hook for how warnings are shown.
    """
    import warnings

    shown: set[tuple] = set()
    show = warnings.showwarning

    def show_once(message, category, filename, lineno, file=None, line=None):
        key = (str(message), category, filename, lineno)
        if key not in shown:
            shown.add(key)
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_once


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


STOP_FILE = "stop.request"  # the run folder's stop request (backend/runs/folder.py)
PROGRESS_FILE = "progress.json"  # rank 0's last finished step (backend/runs/folder.py)


def write_progress(
    run_dir: Path, step: int, saving: bool = False, micro: int = 0, forwards: int = 0, warning: str | None = None
) -> None:
    """Rank 0's last finished step and when, the micro-batches it has done (a step of many is progress as they
    come), its forward passes (GRPO writes answers a token a pass, for minutes inside one micro-batch), and
    whether it is saving a checkpoint (which is no stall); replaced whole: never read half-written. `warning`: the
    run's latest warning (a reward that scored no answer), which the supervisor carries to the run's state line."""
    tmp = run_dir / f".{PROGRESS_FILE}.tmp"
    record = {"step": step, "micro": micro, "forwards": forwards, "time": time.time(), "saving": saving}
    if warning:
        record["warning"] = warning
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, run_dir / PROGRESS_FILE)


STARTUP_FILE = "startup.json"  # rank 0's phases before its first step (backend/runs/startup.py)
RANK_STARTUP_FILE = "rank{rank}.startup.json"  # under logs/: every other rank's


class StartupPhases:
    """This rank's phases before its first step, each with when it began, rewritten whole as it enters each: rank
    0's in startup.json, the others' in logs/rank<N>.startup.json with their host. Loading a 70B model can take many
    minutes, and a run that says only "step 0" all that while reads as hung; the panel's progress line names rank
    0's phase, and the rank behind it when rank 0 waits. "training" closes the list once the first step is done.
    A rank below 0 writes nothing."""

    def __init__(self, run_dir: Path, rank: int):
        self.path = None
        if rank == 0:
            self.path = run_dir / STARTUP_FILE
        elif rank > 0:
            self.path = run_dir / "logs" / RANK_STARTUP_FILE.format(rank=rank)
        self.phases: list[dict] = []
        self._slow = _parse_slow_phase(os.environ.get(FAULT_ENV), rank)

    def enter(self, phase: str) -> None:
        if self.path is None or (self.phases and self.phases[-1]["phase"] == "training"):
            return
        self.phases.append({"phase": phase, "at": time.time()})
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with contextlib.suppress(OSError):  # a full disk must not stop the run for this
            tmp.write_text(json.dumps({"host": socket.gethostname(), "phases": self.phases}), encoding="utf-8")
            os.replace(tmp, self.path)
        if self._slow and self._slow[0] == phase:
            time.sleep(self._slow[1])  # fault injection: a slow node (see _parse_slow_phase)


class StopRequest:
    """Set by SIGTERM/SIGINT, or by a stop.request file in the run folder; the training loop acts on it
    at the next step boundary.

    The file reaches every node through the shared run folder without a signal: on Slurm a signal
    also reaches torch's elastic agent, which kills its ranks 30 s later, saved or not (slurm.sbatch
    writes the file when the time limit nears).
    """

    def __init__(self, run_dir: Path | None = None):
        self._set = False
        self._file = run_dir / STOP_FILE if run_dir is not None else None

    @property
    def requested(self) -> bool:
        if not self._set and self._file is not None and self._file.exists():
            print(f"found {STOP_FILE}: stopping after the current step", flush=True)
            self._set = True
        return self._set

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if not self._set:
            print(f"received {signal.Signals(signum).name}: stopping after the current step", flush=True)
        self._set = True


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
    sharded = is_sharded_run()
    if bnb is not None:
        kwargs["quantization_config"] = bnb
        if not sharded:
            # DDP: each rank holds the whole quantized model on its own device (TRL's get_kbit_device_map).
            # Under ZeRO-3 transformers refuses any device_map ("DeepSpeed Zero-3 is not compatible with
            # passing a device_map"); without one, bitsandbytes places the model on the rank's current
            # device, as the PEFT docs' ZeRO-3 and FSDP QLoRA recipes load it.
            kwargs["device_map"] = {"": str(args.device)}
    model = AutoModelForCausalLM.from_pretrained(model_cfg["name_or_path"], **kwargs)
    if bnb is not None and not sharded:
        # Not for sharded QLoRA: it upcasts the non-quantized weights to fp32 (a second copy at the load
        # peak), and FSDP and ZeRO-3 need one dtype throughout (axolotl skips it there too; TRL never calls it).
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(args.activation_checkpointing),
            gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs,
        )
    return model


def is_sharded_run() -> bool:
    """The launcher asked for sharded parameters: DeepSpeed ZeRO-3 (set up by SFTConfig) or FSDP."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled() or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


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
    if looks_local(source) or path.suffix.lower() in DATA_FILE_BUILDERS:
        raise JobError(f"dataset.path: {missing_path(source, Path.cwd())}")
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
    """Map the spec's formats onto what TRL reads: text, prompt/completion, messages or prompt/chosen/rejected."""
    fmt = dataset_cfg.get("format", "text")
    field = lambda name: column(dataset_cfg, name)  # noqa: E731
    if fmt == "text":
        col = field("text_field")
        _require_columns(dataset, {"text_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, text_column) if col != text_column else dataset
    if fmt == "prompt-completion":
        prompt, completion = field("prompt_field"), field("completion_field")
        _require_columns(dataset, {"prompt_field": prompt, "completion_field": completion})
        dataset = dataset.select_columns([prompt, completion])
        return dataset.rename_columns({c: n for c, n in ((prompt, "prompt"), (completion, "completion")) if c != n})
    if fmt == "messages":
        col = field("messages_field")
        _require_columns(dataset, {"messages_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, "messages") if col != "messages" else dataset
    if fmt == "alpaca":
        instruction, given, output = (
            field("instruction_field"),
            field("input_field"),
            field("output_field"),
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
    if fmt in ("preference", "unpaired-preference"):
        names = {field: field.removesuffix("_field") for field in FORMAT_COLUMNS[fmt]}  # TRL's: prompt, chosen, ...
        columns = {name: field(name) for name in names}
        _require_columns(dataset, columns)
        dataset = dataset.select_columns(list(columns.values()))
        dataset = dataset.rename_columns({columns[name]: trl for name, trl in names.items() if columns[name] != trl})
        if fmt == "unpaired-preference" and dataset.features["label"].dtype != "bool":  # CSV: "true", 1, ...
            dataset = dataset.map(lambda row, i: {"label": _label_of_row(row["label"], i, columns)}, with_indices=True)
        return dataset
    if fmt == "prompt-only":  # GRPO: the rewards get every other column too (TRL passes them by name)
        prompt, answer = field("prompt_field"), field("answer_field")
        _require_columns(dataset, {"prompt_field": prompt})
        renames = {prompt: "prompt"}
        if answer in dataset.column_names and answer != "answer":
            if "answer" in dataset.column_names:
                dataset = dataset.remove_columns(["answer"])
            renames[answer] = "answer"
        return dataset.rename_columns({c: n for c, n in renames.items() if c != n})
    raise JobError(f"dataset.format: {fmt!r} is not one of {', '.join(FORMAT_COLUMNS)}")


def load_datasets(job: dict, args, tokenizer):
    """(training rows, evaluation rows or None, {source: training rows it gave}) as TRL's trainer takes them."""
    dataset_cfg = job.get("dataset") or {}
    if dataset_cfg.get("format") == "messages" and not tokenizer.chat_template:
        raise JobError(
            f"dataset.format: messages needs a chat template, and the tokenizer of {job['model']['name_or_path']} "
            "has none; use a chat model or the prompt-completion format"
        )
    text_column = getattr(args, "dataset_text_field", "text")  # DPOConfig has none: preference data has no text column
    train = to_trl_format(load_split(dataset_cfg, dataset_cfg.get("split") or "train"), dataset_cfg, text_column)
    train, rows = mixed_in(train, dataset_cfg, text_column, int(getattr(args, "seed", 42)))
    evaluation = None
    if dataset_cfg.get("eval_split"):
        evaluation = to_trl_format(load_split(dataset_cfg, dataset_cfg["eval_split"]), dataset_cfg, text_column)
    if job.get("objective") == "grpo":
        limit = int((job.get("grpo") or {}).get("max_prompt_length") or 512)
        train = prompts_within(train, tokenizer, limit, "dataset.split")
        evaluation = evaluation and prompts_within(evaluation, tokenizer, limit, "dataset.eval_split")
    return train, evaluation, rows


# ---------------------------------------------------------------- dataset.mix
# SOURCE[@CONFIG][:SPLIT][#ROWS], as backend/spec/mix.py reads it (tests/spine/test_dataset_mix.py checks the copy).
MIX_ENTRY = re.compile(r"(?P<path>[^@#]+?)(?:@(?P<config>[^:#]+))?(?::(?P<split>[^#]+))?(?:#(?P<rows>[0-9]+))?")


def mix_sources(dataset_cfg: dict) -> list[tuple[str, dict, str, int | None]]:
    """(entry, the dataset config that reads it, split, rows or None) of each dataset.mix entry."""
    sources = []
    for entry in dataset_cfg.get("mix") or []:
        match = MIX_ENTRY.fullmatch(str(entry).strip())
        if match is None:
            raise JobError(f"dataset.mix: {entry!r} is not SOURCE[@CONFIG][:SPLIT][#ROWS]")
        config = {**dataset_cfg, "path": match["path"].strip(), "name": match["config"]}
        rows = int(match["rows"]) if match["rows"] else None
        sources.append((str(entry).strip(), config, (match["split"] or "train").strip(), rows))
    return sources


def mixed_in(train, dataset_cfg: dict, text_column: str, seed: int):
    """(The training rows with each dataset.mix source's rows after them, {source: its rows}): the trainer shuffles
    them all. Says how many rows each source gave, so the log shows what the run trained on."""
    from datasets import concatenate_datasets

    rows_of = {"dataset.path": len(train)}
    sources = mix_sources(dataset_cfg)
    if not sources:
        return train, rows_of
    parts, counts = [train], [f"{len(train):,} from dataset.path"]
    for entry, config, split, rows in sources:
        try:
            part = in_job_format(load_split(config, split), config, text_column)
        except JobError as exc:
            raise JobError(f"dataset.mix {entry!r}: {str(exc).split(': ', 1)[-1]}") from exc
        if not len(part):
            raise JobError(f"dataset.mix {entry!r}: the split {split!r} has no rows; fix the entry or leave it out")
        had = len(part)
        if rows is not None:
            part = resampled(part, rows, seed)
        try:
            parts.append(part.cast(train.features) if part.features != train.features else part)
        except (ValueError, TypeError) as exc:
            raise JobError(
                f"dataset.mix {entry!r}: its rows do not have the main dataset's columns and types ({exc}); "
                "mix in data of the same dataset.format and column types, or of a format named by its columns"
            ) from exc
        counts.append(f"{len(part):,} from {entry}" + (f" (of {had:,})" if rows is not None and rows != had else ""))
        rows_of[entry] = len(part)
    print(f"dataset: {sum(len(p) for p in parts):,} training rows: " + ", ".join(counts), flush=True)
    return concatenate_datasets(parts), rows_of


def resampled(dataset, rows: int, seed: int):
    """`rows` rows of the dataset: a seeded sample of fewer, or whole copies of it and a sample for the rest."""
    copies, rest = divmod(rows, len(dataset))
    indices = list(range(len(dataset))) * copies + random.Random(seed).sample(range(len(dataset)), rest)
    return dataset.select(indices)


# A mixed-in source in another SFT format joins the job's rows converted, its format named by its columns' usual
# names (as LLaMA-Factory and ms-swift read each dataset of a mix in its own format). What TRL reads of each:
TRL_LAYOUT = {
    "text": "text",
    "prompt-completion": "prompt-completion",
    "alpaca": "prompt-completion",
    "messages": "messages",
}
FORMAT_BY_COLUMNS = (("messages", {"messages"}), ("alpaca", {"instruction", "output"}),
                     ("prompt-completion", {"prompt", "completion"}), ("text", {"text"}))  # fmt: skip


def format_by_columns(columns) -> str | None:
    """The SFT format a source's column names say, by their usual names; None when they say none."""
    return next((fmt for fmt, needs in FORMAT_BY_COLUMNS if needs <= set(columns)), None)


def joins(source_format: str, job_format: str) -> bool:
    """Whether rows of `source_format` convert to `job_format`'s: the same layout for TRL, or a prompt and its
    completion made one chat (a user turn, then the assistant's) or one text."""
    have, want = TRL_LAYOUT.get(source_format), TRL_LAYOUT.get(job_format)
    return have is not None and want is not None and (have == want or have == "prompt-completion")


def cannot_join(columns, own: str, job_format: str) -> str:
    welcome = ", ".join(fmt for fmt in TRL_LAYOUT if joins(fmt, job_format))
    return (
        f"its columns ({', '.join(columns)}) are the {own} format's, and {own} rows cannot join a {job_format} job; "
        f"mix in rows of these formats: {welcome}"
    )


def in_job_format(dataset, dataset_cfg: dict, text_column: str):
    """A dataset.mix source's rows as TRL reads the job's: read with the job's format and columns; where those
    columns are missing, in the format its own columns name, converted (JobError when it names none that joins)."""
    job_format = dataset_cfg.get("format", "text")
    try:
        return to_trl_format(dataset, dataset_cfg, text_column)
    except JobError:
        own = format_by_columns(dataset.column_names)
        if own is None or own == job_format:
            raise
    if not joins(own, job_format):
        raise JobError(f"dataset.mix: {cannot_join(dataset.column_names, own, job_format)}")
    if own == "alpaca" and TRL_LAYOUT[job_format] == "messages":  # the instruction and its input as the user's turn
        return dataset.map(
            lambda row: _chat(f"{row['instruction']}\n\n{row['input']}" if row.get("input") else row["instruction"],
                              row["output"]),
            remove_columns=dataset.column_names,
        )  # fmt: skip
    rows = to_trl_format(dataset, {"format": own}, text_column)  # its own columns, by their usual names
    if TRL_LAYOUT[job_format] == "messages":
        return rows.map(lambda row: _chat(row["prompt"], row["completion"]), remove_columns=rows.column_names)
    if TRL_LAYOUT[job_format] == "text":
        return rows.map(
            lambda row: {text_column: _text(row["prompt"]) + _text(row["completion"])}, remove_columns=rows.column_names
        )
    return rows


def _chat(prompt, answer) -> dict:
    return {"messages": [{"role": "user", "content": _text(prompt)}, {"role": "assistant", "content": _text(answer)}]}


def _text(value) -> str:
    """A converted row's prompt or answer: text, not already a chat (a chat's prompt joins only a chat job as is)."""
    if not isinstance(value, str):
        raise JobError(
            f"dataset.mix: a prompt or answer holds {_kind_of(value)}, not text; convert the file to messages"
        )
    return value


def prompts_within(dataset, tokenizer, limit: int, split_field: str):
    """GRPO's rows whose prompt fits grpo.max_prompt_length tokens (GRPOConfig has no max_length: TRL 1.16 would
    write answers after a prompt of any length, and the memory estimate counts on the limit); says how many left."""

    def fits(row) -> bool:
        prompt = row["prompt"]
        if isinstance(prompt, list):  # a chat: as the model sees it, with the generation prompt
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) else ids
        else:
            ids = tokenizer(prompt)["input_ids"]
        return len(ids) <= limit

    kept = dataset.filter(fits)
    dropped = len(dataset) - len(kept)
    if not len(kept):
        raise JobError(
            f"grpo.max_prompt_length: every prompt of {split_field} is longer than {limit} tokens; raise it to the "
            "prompts' length (tunedeck preview shows them)"
        )
    if dropped:
        print(
            f"grpo: {dropped} of {len(dataset)} prompts are longer than grpo.max_prompt_length ({limit} tokens) "
            "and are left out; raise it to keep them",
            flush=True,
        )
    return kept


# ---------------------------------------------------------------- input checks
# Run here at start, and by tunedeck before launch (backend/runs/preflight.py), with the same wording:
# a missing local model otherwise reads "Repo id must be in the form ...", and a bad JSONL file
# StopIteration (empty) or "'list' object has no attribute 'endswith'" (wrong types) from the libraries.

ROWS_CHECKED = 100
# What each dataset.format reads: spec field -> (default column, what its values must be). This
# script's copy of tunedeck's dataset-format table (backend/recipe/vocabulary.py; tests/spine/test_vocabulary.py
# checks that they agree).
FORMAT_COLUMNS = {
    "text": {"text_field": ("text", "text")},
    "prompt-completion": {
        "prompt_field": ("prompt", "text or chat"),
        "completion_field": ("completion", "text or chat"),
    },
    "messages": {"messages_field": ("messages", "chat")},
    "alpaca": {
        "instruction_field": ("instruction", "text"),
        "input_field": ("input", "optional text"),
        "output_field": ("output", "text"),
    },
    "preference": {
        "prompt_field": ("prompt", "text or chat"),
        "chosen_field": ("chosen", "text or chat"),
        "rejected_field": ("rejected", "text or chat"),
    },
    "unpaired-preference": {
        "prompt_field": ("prompt", "text or chat"),
        "completion_field": ("completion", "text or chat"),
        "label_field": ("label", "label"),
    },
    "prompt-only": {
        "prompt_field": ("prompt", "text or chat"),
        "answer_field": ("answer", "optional text"),
    },
}
CHAT_EXAMPLE = '[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]'
KIND_NEEDS = {
    "text": 'a string, e.g. "The answer is 4."',
    "optional text": "a string or null",
    "text or chat": f"a string, or a list of messages such as {CHAT_EXAMPLE}",
    "chat": f"a list of messages, e.g. {CHAT_EXAMPLE}",
    "label": "true (a good answer) or false (a bad one), or 1/0",
}
LABEL_WORDS = {"true": True, "1": True, "false": False, "0": False}


def as_label(value) -> bool | None:
    """A good/bad label as a bool (JSON true/false, or 1/0 and their words as CSV reads them), None if it is none."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    return LABEL_WORDS.get(value.strip().lower()) if isinstance(value, str) else None


def column(dataset_cfg: dict, field: str) -> str:
    """The column name a dataset field names (its default when empty)."""
    defaults = {name: default for columns in FORMAT_COLUMNS.values() for name, (default, _) in columns.items()}
    return dataset_cfg.get(field) or defaults[field]


def looks_local(name: str) -> bool:
    """A path rather than a hub id (hub ids are "name" or "org/name")."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def _where(source: str, base: Path) -> str:
    return "" if Path(source).expanduser().is_absolute() else f" (a relative path is taken from the run folder, {base})"


def missing_path(source: str, base: Path) -> str:
    return f"{source} does not exist{_where(source, base)}; fix the path"


def model_problem(name_or_path: str, base: Path) -> str | None:
    """Why model.name_or_path cannot be loaded, when that shows without the network."""
    path = base / Path(name_or_path).expanduser()
    fix = "give the folder a model was saved to (with config.json) or a Hugging Face hub id such as meta-llama/Llama-2-7b-hf"
    if path.is_dir():
        return None if (path / "config.json").is_file() else f"the folder {path} has no config.json: {fix}"
    if path.exists():
        return f"{path} is a file: {fix}"
    if looks_local(name_or_path):
        return f"{name_or_path} does not exist{_where(name_or_path, base)}: {fix}"
    return None


def _kind_of(value) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "true/false", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _label_of_row(value, index: int, columns: dict) -> bool:
    label = as_label(value)
    if label is None:
        raise JobError(
            f"dataset.label_field: row {index} of column {columns['label_field']!r} holds {value!r}, not "
            f"{KIND_NEEDS['label']}; fix that row"
        )
    return label


def _value_problem(value, kind: str) -> str | None:
    """Why a value is not of the kind a format needs ("text", "chat", ...), or None."""
    if kind == "optional text" and (value is None or isinstance(value, str)):
        return None
    if kind == "label":
        return None if as_label(value) is not None else (repr(value) if isinstance(value, str) else _kind_of(value))
    if "text" in kind and isinstance(value, str):
        return None
    if "chat" in kind and isinstance(value, list):
        bad = next(
            (i for i, m in enumerate(value) if not (isinstance(m, dict) and "role" in m and "content" in m)), None
        )
        if bad is None and value:
            return None
        return "an empty list" if not value else f"a list whose item {bad} is not a message with role and content"
    return _kind_of(value)


def _rows(path: Path, limit: int):
    """("line N" or, in a JSON array, "item N", row) of the file's first rows. JobError when one cannot be read."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        import csv

        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.DictReader(f)
            for count, row in enumerate(reader):
                if count >= limit:
                    return
                yield f"line {reader.line_num}", row
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if suffix == ".json" and head.startswith("["):
            try:
                items = json.load(f)
            except ValueError as exc:
                raise JobError(
                    f"dataset.path: {path} line {exc.lineno} is not valid JSON ({exc.msg}): fix the file"
                ) from None
            yield from ((f"item {i + 1}", item) for i, item in enumerate(items[:limit]))
            return
        seen = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise JobError(
                    f"dataset.path: {path} line {number} is not valid JSON ({exc.msg}): fix or remove "
                    "that line; each line must be one JSON object"
                ) from None
            yield f"line {number}", row
            seen += 1
            if seen >= limit:
                return


def dataset_problems(
    dataset_cfg: dict, base: Path, limit: int = ROWS_CHECKED, needed: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(field, message) for a local data file whose first rows do not parse or do not fit dataset.format.
    needed: optional columns the job needs all the same (GRPO's answer rewards read the reference answer)."""
    source = str(dataset_cfg.get("path") or "")
    path = base / Path(source).expanduser()
    if path.is_dir() or not (path.is_file() or looks_local(source) or path.suffix.lower() in DATA_FILE_BUILDERS):
        return []  # a folder or a hub dataset: the datasets library reads it at run time
    if not path.is_file():
        return [("dataset.path", missing_path(source, base))]
    if path.suffix.lower() not in (".json", ".jsonl", ".csv"):
        return []  # parquet: its columns are checked once loaded
    fmt = dataset_cfg.get("format", "text")
    columns = {field: (column(dataset_cfg, field), kind) for field, (_, kind) in FORMAT_COLUMNS.get(fmt, {}).items()}
    problems: dict[str, str] = {}  # one per field: the first row that shows it
    rows = 0
    try:
        for where, row in _rows(path, limit):
            rows += 1
            at = f"{path} {where}"
            if not isinstance(row, dict):
                problems.setdefault(
                    "dataset.path",
                    f"{at} holds {_kind_of(row)}, not a JSON object: each row must be an object of columns",
                )
                continue
            for field, (col, kind) in columns.items():
                if col not in row:
                    if kind != "optional text" or field in needed:
                        problems.setdefault(
                            f"dataset.{field}",
                            f"{at} has no column {col!r} (it has {', '.join(map(repr, row)) or 'none'}): set dataset.{field} "
                            f"to the column that holds the {field.removesuffix('_field')}, or change dataset.format",
                        )
                    continue
                wrong = _value_problem(row[col], kind)
                if wrong:
                    problems.setdefault(
                        f"dataset.{field}",
                        f"{at}: column {col!r} holds {wrong}, but dataset.format {fmt} needs {KIND_NEEDS[kind]} there; "
                        "fix the file or choose the dataset.format that matches it",
                    )
    except JobError as exc:
        return [("dataset.path", str(exc).removeprefix("dataset.path: "))]
    except (OSError, UnicodeDecodeError) as exc:
        return [("dataset.path", f"{path} cannot be read ({exc}); fix its permissions or point to another file")]
    if not rows:
        example = {c: "..." for c, _ in columns.values()}
        return [
            (
                "dataset.path",
                f"{path} has no rows: give a file with one JSON object per line, e.g. {json.dumps(example)}",
            )
        ]
    return list(problems.items())


def input_problems(job: dict, base: Path) -> list[tuple[str, str]]:
    """(field, message) for every problem of the job's local model and data that shows before loading them."""
    problems = []
    model = model_problem(str((job.get("model") or {}).get("name_or_path") or ""), base)
    if model:
        problems.append(("model.name_or_path", model))
    if (job.get("training") or {}).get("use_liger_kernel") and importlib.util.find_spec("liger_kernel") is None:
        # transformers would raise only once the trainer is built, after the model loaded.
        problems.append(
            (
                "training.use_liger_kernel",
                "needs the liger-kernel package, which is not installed: pip install liger-kernel, "
                "or set training.use_liger_kernel=false",
            )
        )
    needed = ()
    if job.get("objective") == "grpo":
        rewards = (job.get("grpo") or {}).get("rewards") or ["exact_answer"]
        problems += [("grpo.rewards", problem) for entry in rewards if (problem := reward_problem(entry))]
        needed = ("answer_field",) if any(entry in REWARD_FUNCTIONS for entry in rewards) else ()
    dataset_cfg = job.get("dataset") or {}
    problems += dataset_problems(dataset_cfg, base, needed=needed)
    try:
        sources = mix_sources(dataset_cfg)
    except JobError as exc:
        return problems + [("dataset.mix", str(exc).removeprefix("dataset.mix: "))]
    for entry, config, _, _ in sources:  # each mixed-in file as the main one, or in the format its columns name
        problems += [("dataset.mix", f"{entry!r}: {message}") for message in mix_problems(config, base, needed)]
    return problems


def mix_problems(config: dict, base: Path, needed: tuple[str, ...]) -> list[str]:
    """A mixed-in local file's problems: in the job's format, or, when its columns name another, in that one (or
    that its rows cannot join the job's)."""
    found = [message for _, message in dataset_problems(config, base, needed=needed)]
    job_format = config.get("format", "text")
    own, columns = _first_row_format(config, base) if found else (None, [])
    if own is None or own == job_format:
        return found
    if not joins(own, job_format):
        return [cannot_join(columns, own, job_format)]
    return [message for _, message in dataset_problems({"path": config["path"], "format": own}, base)]


def _first_row_format(dataset_cfg: dict, base: Path) -> tuple[str | None, list[str]]:
    """(format_by_columns, the columns) of a local data file's first row; (None, []) for anything else or a file
    that does not read."""
    path = base / Path(str(dataset_cfg.get("path") or "")).expanduser()
    if not path.is_file() or path.suffix.lower() not in (".json", ".jsonl", ".csv"):
        return None, []
    try:
        row = next((row for _, row in _rows(path, 1)), None)
    except (JobError, OSError, UnicodeDecodeError):
        return None, []
    return (format_by_columns(row), list(row)) if isinstance(row, dict) else (None, [])


# ---------------------------------------------------------------- GRPO's rewards
# Each scores a list of written answers (TRL's completions: text, or a list of messages for chat prompts) against
# the rows' reference answers (the dataset's answer column, TRL passes every column by name). A row without a
# reference answer gets None, which TRL leaves out of the mean. tunedeck describes them in backend/recipe/vocabulary.py.

ANSWER_MARK = "####"  # GSM8K's mark before the final answer
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _answer_text(value) -> str:
    if isinstance(value, list):  # a chat completion: the messages the model wrote
        return " ".join(str(message.get("content", "")) for message in value if isinstance(message, dict))
    return "" if value is None else str(value)


def final_answer(text: str) -> str:
    """The answer a text gives: after its last '####', else inside its last \\boxed{}, else all of it; spaces
    collapsed and a closing period dropped."""
    if ANSWER_MARK in text:
        text = text.rsplit(ANSWER_MARK, 1)[1]
    elif boxed := BOXED.findall(text):
        text = boxed[-1]
    return " ".join(text.split()).rstrip(".")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _per_answer(score):
    """A reward as TRL calls it, from score(final answer, reference's final answer); None for a row without one."""

    @functools.wraps(score)  # TRL names a reward by its function's name
    def reward(completions, answer=None, **_) -> list[float | None]:
        references = answer or [None] * len(completions)
        return [
            None if ref is None else score(final_answer(_answer_text(text)), final_answer(str(ref)))
            for text, ref in zip(completions, references)
        ]

    return reward


@_per_answer
def exact_answer(got: str, want: str) -> float:
    """1 when the final answer equals the reference answer (numbers compared as numbers: 4.0 is 4), else 0."""
    same = got == want or (_number(got) is not None and _number(got) == _number(want))
    return 1.0 if same else 0.0


@_per_answer
def close_answer(got: str, want: str) -> float:
    """Partial credit: a number off by d scores 1/(1+d) (a non-number 0); other answers the share of their words in
    the right place."""
    if _number(want) is not None:
        return 0.0 if _number(got) is None else 1.0 / (1.0 + abs(_number(got) - _number(want)))
    words, wanted = got.split(), want.split()
    return sum(a == b for a, b in zip(words, wanted)) / max(len(words), len(wanted), 1)


REWARD_FUNCTIONS = {"exact_answer": exact_answer, "close_answer": close_answer}
CUSTOM_REWARD = re.compile(r"^(?P<file>/.+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")  # as spec_grpo.py reads it


def reward_problem(entry: str) -> str | None:
    """Why a reward cannot be loaded here (a custom reward's file or function is missing), or None."""
    if entry in REWARD_FUNCTIONS:
        return None
    found = CUSTOM_REWARD.match(str(entry))
    if not found:
        return f"{entry!r} is no reward: use {' or '.join(REWARD_FUNCTIONS)}, or /path/to/FILE.py:FUNCTION"
    path, name = Path(found["file"]), found["function"]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}): the reward file must be on the machine that trains"
    except SyntaxError as exc:
        return f"{path} line {exc.lineno}: {exc.msg}; fix the reward file"
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    if name not in defined:
        return f"{path} defines no function {name!r} (it defines {', '.join(sorted(defined)) or 'none'})"
    return None


def reward_functions(job: dict) -> list:
    """The job's rewards as callables, each checked as TRL calls it (checked_reward): the built-in ones, and your own
    loaded from their files (train() imports them under the stall watchdog: a module may hang at import)."""
    functions = []
    for index, entry in enumerate((job.get("grpo") or {}).get("rewards") or ["exact_answer"]):
        if entry in REWARD_FUNCTIONS:
            functions.append(checked_reward(REWARD_FUNCTIONS[entry], f"the reward {entry} (grpo.rewards[{index}])"))
            continue
        found = CUSTOM_REWARD.match(entry)
        spec = importlib.util.spec_from_file_location(f"reward_{Path(found['file']).stem}", found["file"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        name = f"the reward {found['function']} (grpo.rewards[{index}]: {entry})"
        functions.append(checked_reward(getattr(module, found["function"]), name))
    return functions


class RewardError(JobError):
    """A reward returned what GRPO cannot learn from; the message names the reward and what it returned."""


def checked_reward(function, name: str):
    """`function` as TRL calls it (prompts=, completions=, the rows' columns by name), with what it returns checked
    (check_scores): TRL turned NaN, inf and a bare number into a run that "finished" having learned nothing, and None
    or text into errors that did not say which reward. Keeps the name TRL gives the reward (trl.trainer.utils'
    get_callable_name: a function's name, a callable object's class name) and, for an async reward, its being async
    (TRL awaits those: is_async_callable)."""

    def reward(*args, **columns):
        return check_scores(function(*args, **columns), name, _by_name(args, columns))

    async def async_reward(*args, **columns):
        return check_scores(await function(*args, **columns), name, _by_name(args, columns))

    plain = function
    while isinstance(plain, functools.partial):
        plain = plain.func
    is_async = inspect.iscoroutinefunction(plain) or inspect.iscoroutinefunction(type(plain).__call__)
    checked = async_reward if is_async else reward
    checked.__name__ = checked.__qualname__ = getattr(plain, "__name__", type(plain).__name__)
    return checked


def _by_name(args: tuple, columns: dict) -> dict:
    """A reward's arguments by name: TRL passes them so; a call by position gives the answers first."""
    return {"completions": args[0], **columns} if args else columns


def check_scores(scores, name: str, columns: dict) -> list:
    """The scores a reward returned, as a list, if they are one finite number (or None: the reward does not apply)
    per answer; else RewardError naming the reward, what it returned and, for a bad score, the answer's row."""
    answers = list(columns.get("completions") or [])
    if hasattr(scores, "tolist") and not isinstance(scores, (str, bytes)):
        scores = scores.tolist()  # a numpy array or a tensor
    if not isinstance(scores, (list, tuple)):
        raise RewardError(
            f"{name} returned {_shown(scores)} for {len(answers)} answers: a reward returns a list of one number "
            "per answer (None where it does not apply)"
        )
    if len(scores) != len(answers):
        raise RewardError(
            f"{name} returned {len(scores)} scores for {len(answers)} answers: one number per answer (None where "
            "it does not apply)"
        )
    for i, score in enumerate(scores):
        if score is None:
            continue
        if not isinstance(score, numbers.Real):
            problem = "each score is a number, or None where the reward does not apply"
        elif not math.isfinite(score):
            problem = "a score must be a finite number: GRPO learns nothing from the whole step otherwise"
        else:
            continue
        raise RewardError(f"{name} returned {_shown(score)} for {_row(columns, i, len(answers))}: {problem}")
    return list(scores)


def _shown(value, limit: int = 80) -> str:
    """What a reward returned, in a few words: "None", "a str '0.5'", "a float nan"."""
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "None" if value is None else f"a {type(value).__name__} {text}"


def _row(columns: dict, i: int, count: int, limit: int = 60) -> str:
    """Which answer: 'answer 3 of 8 (prompt 'Q: 2+2?', answer '5')'."""
    parts = []
    for column, label in (("prompts", "prompt"), ("completions", "answer")):
        values = columns.get(column) or []
        if i < len(values):
            text = _answer_text(values[i])
            parts.append(f"{label} {(text if len(text) <= limit else text[: limit - 3] + '...')!r}")
    return f"answer {i + 1} of {count}" + (f" ({', '.join(parts)})" if parts else "")


def unscored_warning(names: list[str], rewards, step: int) -> str | None:
    """A warning naming each reward that scored none of a step's answers, from GRPOTrainer's rewards of every rank
    (a row per answer, a column per reward; None is NaN there); None when each scored some. TRL leaves None out of
    the mean, which is right for a row a reward does not apply to, but a reward with nothing to say for a whole step
    gives GRPO nothing to learn from it, and TRL only warns when every reward is None for an answer."""
    silent = [f"{name} (grpo.rewards[{i}])" for i, name in enumerate(names) if bool(rewards[:, i].isnan().all())]
    if not silent:
        return None
    one = len(silent) == 1
    return (
        f"{'the reward' if one else 'the rewards'} {', '.join(silent)} scored none of the {len(rewards)} answers at "
        f"step {step} (None for each): GRPO learned nothing from {'it' if one else 'them'} there"
    )


# ---------------------------------------------------------------- what the run actually got


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total), counting ZeRO-3 partitioned and 4-bit packed parameters at full size (as PEFT does)."""
    # A 4-bit weight holds in x out values, packed; under FSDP2 it is a DTensor, no longer a Params4bit.
    four_bit = {
        id(m.weight): m.in_features * m.out_features for m in model.modules() if type(m).__name__ == "Linear4bit"
    }
    trainable = total = 0
    for param in model.parameters():
        n = four_bit.get(id(param)) or (param.ds_numel if hasattr(param, "ds_numel") else param.numel())
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total


def describe_run(trainer, job: dict) -> dict:
    """The start record: facts read from the live objects, not from the config that asked for them.

    Every rank calls it: each rank's node name is gathered (a collective)."""
    import torch.distributed as dist

    wrapped = trainer.model_wrapped
    zero_stage = None
    if trainer.is_deepspeed_enabled:
        engine = trainer.deepspeed or wrapped
        zero_stage = int(engine.zero_optimization_stage())
    fsdp_version = _fsdp_version(wrapped)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    trainable, total = count_parameters(trainer.model)
    quantized: dict[str, int] = {}
    for module in trainer.model.modules():
        if type(module).__module__.startswith("bitsandbytes"):
            quantized[type(module).__name__] = quantized.get(type(module).__name__, 0) + 1
    return {
        "event": "start",
        "time": time.time(),
        "world_size": _world_size(),
        "nodes": gather_from_ranks(node_name()),  # rank i runs on nodes[i]
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "zero_stage": zero_stage,
        "sequence_parallel": sequence_parallel_size(trainer.accelerator),
        "environment": {name: os.environ.get(name) for name in environment_names(job)},
        "fsdp": fsdp_version is not None,
        "fsdp_version": fsdp_version,
        "model_class": type(wrapped).__name__,
        "optimizer_class": type(optimizer).__name__ if optimizer is not None else None,
        "device": str(trainer.args.device),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "method": job.get("method", "lora"),
        "objective": job.get("objective") or "sft",
        "reference": reference_model(trainer),
        "quantized_modules": quantized,  # bitsandbytes layers actually in the model: {"Linear4bit": 21}
        "trainable_params": trainable,
        "total_params": total,
        "frozen_dtypes": frozen_dtypes(trainer.model),
        "lora_scaling": adapter_scaling(trainer.model),
        # transformers hooks NEFTune onto the input embeddings (of the base, under PEFT) before training begins
        "neftune_noise_alpha": getattr(unwrap_peft(trainer).get_input_embeddings(), "neftune_noise_alpha", None),
        "max_steps": trainer.state.max_steps,
        "resumed_from_step": trainer.state.global_step or None,
    }


def adapter_scaling(model) -> float | None:
    """The scale PEFT applies to the first LoRA layer's update (all layers share it); None without adapters."""
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and scaling:
            return float(next(iter(scaling.values())))
    return None


def unwrap_peft(trainer):
    """The transformers model inside the trainer's (a PeftModel's base model, as NEFTune's hook finds it)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return model.base_model.model if hasattr(model, "peft_config") else model


def environment_names(job: dict) -> list[str]:
    """The names the job sets for every rank (launch.env's NAME=VALUE entries)."""
    return [str(entry).partition("=")[0].strip() for entry in (job.get("launch") or {}).get("env") or []]


def sequence_parallel_size(accelerator) -> int:
    """GPUs sharing each sequence (DeepSpeed Ulysses), as accelerate set it up: 1 without."""
    config = getattr(accelerator, "parallelism_config", None)
    return int(config.sp_size) if config is not None and config.sp_enabled else 1


def reference_model(trainer) -> str | None:
    """What a DPO or KTO run scores its reference with: "adapters off" (the base, with PEFT), the reference's wrapped
    class (DeepSpeedEngine under ZeRO-3, as TRL prepares it), or "scored before training" (its scores are columns of
    the training rows, preference.precompute_ref_log_probs); None without one (SFT)."""
    if not hasattr(trainer, "ref_model") or getattr(trainer, "beta", None) == 0.0:  # GRPO without a KL weight
        return None
    columns = getattr(trainer.train_dataset, "column_names", None) or []
    if trainer.ref_model is None and any(c.startswith("ref_") and c.endswith("logps") for c in columns):
        return "scored before training"  # the reference's scores are in the rows: no reference during the steps
    return "adapters off" if trainer.ref_model is None else type(trainer.ref_model).__name__


def frozen_dtypes(model) -> dict[str, int]:
    """Frozen parameter tensors per storage dtype, e.g. {"bfloat16": 37}: sharded QLoRA needs one dtype throughout."""
    counts: dict[str, int] = {}
    for param in model.parameters():
        if not param.requires_grad:
            name = str(param.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + 1
    return counts


def _fsdp_version(model) -> int | None:
    """2 when fully_shard wrapped the model (FSDP2), 1 for FullyShardedDataParallel, None when nothing is sharded."""
    from torch.distributed import fsdp

    modules = list(model.modules())
    if any(isinstance(m, fsdp.FSDPModule) for m in modules):
        return 2
    if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in modules):
        return 1
    return None


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def node_name() -> str:
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gather_from_ranks(value) -> list:
    """Every rank's value, in rank order (a collective: all ranks call it); [value] without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def gpu_peaks_gb() -> tuple[list[float], list[float]] | None:
    """Peak allocated / reserved GPU memory of every rank (a collective: all ranks call it), or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    everyone = gather_from_ranks([torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30])
    return [round(m[0], 3) for m in everyone], [round(m[1], 3) for m in everyone]


def load_peaks() -> dict:
    """Every rank's peak memory right after the model loaded, before any sharding (a collective)."""
    import resource

    import torch

    gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    everyone = gather_from_ranks([gpu, host])
    return {
        "load_gpu_peak_allocated_gb": [round(g, 3) for g, _ in everyone] if gpu is not None else None,
        "load_host_peak_rss_gb": [round(h, 3) for _, h in everyone],
    }


# ---------------------------------------------------------------- how fast: MFU and HFU
#
# Model FLOPs utilisation: the FLOPs of the tokens trained (forward + backward, backend/spec/flops.py
# explains the formula) per second, over the GPU's peak dense throughput for the compute dtype.
# HFU adds the forward passes activation checkpointing recomputes. Without a known peak (a CPU
# run, a GPU missing from the table) there is no MFU: the start record says why instead.

# >>> SHARED with backend/recipe/train.py (a verbatim copy there; edit here, then --sync)
# Peak dense (no sparsity) tensor throughput in TFLOPS per GPU and compute dtype, with memory
# in GB and the page each number comes from. Rows are matched against the NVML device name
# (torch.cuda.get_device_name gives the same) in order: the more specific rows first.
# (key, words the normalised name must all contain, memory GB, SXM board (NVLink between GPUs),
#  {dtype: TFLOPS}, source)
GPU_TABLE = (
    ("H200 NVL", ("H200", "NVL"), 141, False, {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60},
     "https://www.nvidia.com/en-us/data-center/h200/"),
    ("H200", ("H200",), 141, True, {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},
     "https://www.nvidia.com/en-us/data-center/h200/"),
    ("H100 NVL", ("H100", "NVL"), 94, False, {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("H100 PCIe", ("H100", "PCIE"), 80, False, {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("H100", ("H100",), 80, True, {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67},
     "https://www.nvidia.com/en-us/data-center/h100/"),
    ("A100-40GB", ("A100", "40GB"), 40, True, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    ("A100-80GB", ("A100",), 80, True, {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    ("A10G", ("A10G",), 24, False, {"bf16": 70, "fp16": 70, "tf32": 35, "fp32": 35},
     "https://d1.awsstatic.com/product-marketing/ec2/NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf"),
    ("A10", ("A10",), 24, False, {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2},
     "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    ("L40S", ("L40S",), 48, False, {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6},
     "https://www.nvidia.com/en-us/data-center/l40s/"),
    ("L40", ("L40",), 48, False, {"bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5},
     "https://www.nvidia.com/en-us/data-center/l40/"),
    ("L4", ("L4",), 24, False, {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3},
     "https://www.nvidia.com/en-us/data-center/l4/"),
    # GeForce: tensor throughput with FP32 accumulation, which PyTorch's bf16/fp16 matmuls use
    # (the headline figures accumulate in FP16 and are twice these).
    ("RTX 4090", ("RTX4090",), 24, False, {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    ("RTX 3090", ("RTX3090",), 24, False, {"bf16": 71, "fp16": 71, "tf32": 35.6, "fp32": 35.6},
     "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"),
    ("RTX 6000 Ada", ("RTX6000ADA",), 48, False, {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    ("A6000", ("A6000",), 48, False, {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
     "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf"),
    # Volta has no bf16 units: a bf16 job there has no peak to compare with.
    ("V100-16GB", ("V100", "16GB"), 16, True, {"fp16": 125, "fp32": 15.7},
     "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    ("V100", ("V100",), 32, True, {"fp16": 125, "fp32": 15.7},
     "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    ("T4", ("T4",), 16, False, {"fp16": 65, "fp32": 8.1},
     "https://www.nvidia.com/en-us/data-center/tesla-t4/"),
)  # fmt: skip
PEAK_ENV = "TUNEDECK_PEAK_TFLOPS"  # a peak to measure against where the table has none (tests, new GPUs)


def normalise_gpu_name(name):
    """'NVIDIA GeForce RTX 4090' -> 'RTX4090', 'NVIDIA A100-SXM4-80GB' -> 'A100SXM480GB'."""
    text = str(name).upper()
    for word in ("NVIDIA", "GEFORCE", "TESLA", "QUADRO", " ", "-", "_"):
        text = text.replace(word, "")
    return text


def gpu_row(name):
    """The GPU_TABLE row of an NVML name or a typed one ('A100-80GB', 'RTX 4090'), or None."""
    text = normalise_gpu_name(name)
    for row in GPU_TABLE:
        if all(word in text for word in row[1]):
            return row
    return None


def peak_tflops(name, dtype):
    """(TFLOPS, source) of a GPU for a compute dtype (bf16, fp16, tf32, fp32), or (None, why not)."""
    row = gpu_row(name)
    if row is None:
        return None, f"{name!r} is not in tunedeck's GPU table (set {PEAK_ENV} to its peak in TFLOPS)"
    tflops = row[4].get(dtype)
    if tflops is None:
        return None, f"{row[0]} has no {dtype} tensor units in its datasheet"
    return float(tflops), row[5]


# Per trained token, the forward passes without gradients of an objective (TRL's trainers), by its reference and
# by the model itself, and the sequences of a row its token count covers: DPO's reference scores the chosen and
# the rejected answer (two sequences a row, both counted); KTO's reference scores the answer and a mismatched
# answer for the KL estimate, which the model scores too (the KL answers are not counted as tokens). GRPO's model
# writes its answers first, a forward a token (with the KV cache; the prompt once); a KL weight (grpo.beta > 0)
# adds a reference pass, counted by extra_forwards, not here: without one GRPO has no reference.
OBJECTIVE_PASSES = {"sft": (0, 0, 1), "dpo": (1, 0, 2), "kto": (2, 1, 1), "grpo": (0, 1, 1)}
# The objectives that always score against a reference (the base with the adapters off, or a frozen copy of it).
REFERENCE_OBJECTIVES = tuple(objective for objective, (reference, _, _) in OBJECTIVE_PASSES.items() if reference)


def extra_forwards(objective: str, precomputed: bool = False, kl_reference: bool = False) -> int:
    """Forward passes without gradients per trained token: the model's own, and the reference's unless its scores
    were computed once before training (preference.precompute_ref_log_probs); kl_reference: GRPO's KL reference."""
    reference, own, _ = OBJECTIVE_PASSES[objective]
    return own + (0 if precomputed else reference) + int(kl_reference)


def sequences_per_row(objective: str) -> int:
    return OBJECTIVE_PASSES[objective][2]


def flops_per_token(
    matmul_params, trainable_params, layers, attention_width, seq_len, full, checkpointing, layer_matmul_params=None,
    extra_forwards=0,
):  # fmt: skip
    """(model FLOPs, hardware FLOPs) per trained token of one training step (forward + backward).

    matmul_params: weights a token is multiplied by (decoder linears, routed experts, the head);
    trainable_params: the weights that get gradients (all of them when full); attention_width:
    heads x head_dim; seq_len: the tokens each sequence attends over; checkpointing: activation
    checkpointing recomputes every layer's forward (layer_matmul_params: the decoder layers'
    share of matmul_params, default all of it); extra_forwards: the forward passes without gradients per
    token that the objective adds (extra_forwards: DPO's reference model, or the base with the adapters off).
    """
    weight_grads = matmul_params if full else trainable_params
    attention = 4 * layers * attention_width * seq_len  # forward: QK^T and AV, 2 FLOPs per multiply-add
    model = 4 * matmul_params + 2 * weight_grads + 3 * attention
    model += extra_forwards * (2 * matmul_params + attention)
    hardware = model
    if checkpointing:
        recomputed = matmul_params if layer_matmul_params is None else layer_matmul_params
        hardware += 2 * recomputed + attention
    return float(model), float(hardware)


# <<< SHARED


def speed_facts(trainer, trainable: int, total: int, objective: str = "sft") -> dict:
    """What MFU needs, for the start record: the GPU, its peak for the compute dtype, the FLOP inputs."""
    import torch

    model, args = trainer.model, trainer.args
    config = getattr(model, "config", None)
    linears = {}  # module name -> in x out, for every matmul a token goes through (LoRA's own included)
    for name, module in model.named_modules():
        leaf = next(module.children(), None) is None  # not PEFT's wrapper around the base layer: counted once
        if leaf and hasattr(module, "in_features") and hasattr(module, "out_features"):
            linears[name] = int(module.in_features) * int(module.out_features)
    head = sum(n for name, n in linears.items() if name.endswith("lm_head"))
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None) or (int(getattr(config, "hidden_size", 0)) // max(1, heads))
    checkpointing = bool(args.gradient_checkpointing)
    fsdp_plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if fsdp_plugin is not None and getattr(fsdp_plugin, "activation_checkpointing", False):
        checkpointing = True
    if args.bf16:
        dtype = "bf16"
    elif args.fp16:
        dtype = "fp16"
    else:
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(getattr(model, "dtype", None))
        dtype = dtype or ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    gpu = torch.cuda.get_device_name(args.device) if torch.cuda.is_available() and args.device.type == "cuda" else None
    facts = {
        "gpu_name": gpu,
        "compute_dtype": dtype,
        "flops_inputs": {
            "matmul_params": sum(linears.values()),
            "layer_matmul_params": sum(linears.values()) - head,
            "trainable_params": trainable,
            "layers": int(getattr(config, "num_hidden_layers", 0) or 0),
            "attention_width": heads * int(head_dim),
            "full": trainable >= total,  # every weight gets its gradient
            "checkpointing": checkpointing,
            # the objective's passes without gradients per token, and the sequences a row's token count covers
            "extra_forwards": extra_forwards(
                objective,
                getattr(args, "precompute_ref_log_probs", False),
                kl_reference=objective == "grpo" and getattr(args, "beta", 0) > 0,
            ),
            "sequences_per_row": sequences_per_row(objective),
        },
    }
    peak, source = None, f"this run computes on {args.device.type.upper()}, not a GPU with a published peak"
    override = os.environ.get(PEAK_ENV)
    if override:  # a typo must not stop a training run: it says why there is no MFU instead
        peak = _tflops(override)
        source = PEAK_ENV if peak else f"{PEAK_ENV}={override!r} is not a number of TFLOPS"
    elif gpu is not None:
        peak, source = peak_tflops(gpu, dtype)
    facts["peak_tflops"] = peak
    if peak:
        facts["peak_source"] = source
    else:
        facts["mfu_note"] = f"MFU is not defined without a known peak: {source} (set {PEAK_ENV} to measure against one)"
    return facts


def _tflops(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e7 else None  # also refuses nan and inf


def utilisation(facts: dict, tokens_per_second: float, seq_len: float) -> dict:
    """{"mfu", "hfu"} of a logging window (tokens/s of all ranks together), or {} without a peak."""
    peak = facts.get("peak_tflops")
    if not peak or tokens_per_second <= 0:
        return {}
    f = facts["flops_inputs"]
    model, hardware = flops_per_token(
        f["matmul_params"], f["trainable_params"], f["layers"], f["attention_width"], seq_len,
        f["full"], f["checkpointing"], f["layer_matmul_params"], f.get("extra_forwards", 0),
    )  # fmt: skip
    per_gpu = tokens_per_second / max(1, _world_size())
    return {"mfu": per_gpu * model / (peak * 1e12), "hfu": per_gpu * hardware / (peak * 1e12)}


# ---------------------------------------------------------------- the sanity gate
#
# Several launches exit 0 while running something else than asked (measured on CPU, see
# the project's notes on CPU distributed runs): `accelerate launch --cpu` and
# distributed_type MULTI_CPU start ONE process, torchrun without use_cpu starts independent
# ones, FSDP on CPU silently becomes DDP. So every run compares what it got with its job
# right after setup, and stops every rank on a difference. The expectation comes from
# job.yaml (the spec) and, for trainable parameters, from PEFT itself on a meta-device copy
# of the model: no tunedeck code is needed on the cluster.


class GateError(JobError):
    """The run did not get what its job asked for."""


ENGINE_NAMES = {"deepspeed": "DeepSpeed", "fsdp": "FSDP", "ddp": "DDP", "none": "no data-parallel wrapper"}
# strategy.kind -> (engine, ZeRO stage): this script's copy of tunedeck's strategy table
# (backend/recipe/vocabulary.py; tests/spine/test_vocabulary.py checks that they agree).
STRATEGY_ENGINES = {
    "ddp": ("ddp", None),
    "zero1": ("deepspeed", 1),
    "zero2": ("deepspeed", 2),
    "zero3": ("deepspeed", 3),
    "fsdp": ("fsdp", None),
}


def expected_run(job: dict) -> dict:
    """What the job asks for, in the terms of the start record."""
    launch, strategy = job.get("launch") or {}, job.get("strategy") or {}
    kind, processes = strategy.get("kind", "ddp"), int(launch.get("num_processes", 1))
    engine, stage = STRATEGY_ENGINES.get(kind, ("ddp", None))
    return {
        "world_size": processes,
        "machines": int(launch.get("num_machines", 1)),
        "engine": "none" if engine == "ddp" and processes == 1 else engine,
        "zero_stage": stage,
        "sequence_parallel": int(strategy.get("sequence_parallel", 1)) if engine == "deepspeed" else 1,
        "fsdp_version": int(strategy.get("fsdp_version", 2)) if engine == "fsdp" else None,
        "bits": (job.get("quantization") or {}).get("bits"),
        "trainable_params": None,  # train() adds expected_trainable(job)
        "lora_scaling": lora_scaling(job),
        "neftune_noise_alpha": (job.get("training") or {}).get("neftune_noise_alpha")
        if job.get("objective", "sft") == "sft"
        else None,
    }


def lora_scaling(job: dict) -> float | None:
    """What PEFT multiplies the adapters' update by: lora_alpha / r, or / sqrt(r) with rsLoRA; None without adapters."""
    if job.get("method", "lora") not in ("lora", "qlora"):
        return None
    lora = job.get("lora") or {}
    r, alpha = int(lora.get("r", 8)), float(lora.get("lora_alpha", 8))
    return alpha / math.sqrt(r) if lora.get("use_rslora") else alpha / r


def expected_trainable(job: dict) -> int | None:
    """PEFT's trainable-parameter count for the job's adapter (all parameters for full fine-tuning).

    Built on the meta device (no memory, no weights read). Call it before SFTConfig exists: under ZeRO-3
    transformers would build the copy inside deepspeed.zero.Init. None when the config cannot be read
    (load_model then says why).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_cfg = job.get("model") or {}
    remote = bool(model_cfg.get("trust_remote_code", False))
    try:
        config = AutoConfig.from_pretrained(
            model_cfg["name_or_path"], trust_remote_code=remote, revision=model_cfg.get("revision") or None
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
    except Exception as exc:  # noqa: BLE001 - a missing or odd model is load_model's to report
        print(f"sanity gate: trainable parameters not checked ({type(exc).__name__}: {exc})", flush=True)
        return None
    adapter = peft_config(job)
    if adapter is None:
        return sum(p.numel() for p in model.parameters())
    from peft import get_peft_model

    with torch.device("meta"):  # the adapters too: a 70B model's take seconds here, a minute on the CPU
        return get_peft_model(model, adapter).get_nb_trainable_parameters()[0]


def engine_of(facts: dict) -> str:
    """deepspeed | fsdp | ddp | none: from the wrapped model, or before wrapping from accelerate's distributed type."""
    if "model_class" not in facts:  # FSDP or DDP is only decided when the model is wrapped
        return {"DEEPSPEED": "deepspeed", "NO": "none"}.get(facts["distributed_type"], "ddp")
    if facts.get("zero_stage") is not None:
        return "deepspeed"
    if facts.get("fsdp_version"):
        return "fsdp"
    return "ddp" if facts.get("model_class") == "DistributedDataParallel" else "none"


def gate_problems(expected: dict, facts: dict) -> list[str]:
    """Each difference between the job and what the run got, worded with its likely cause.

    facts: a start record; or, earlier, only world_size (from the launcher's environment), nodes
    and distributed_type (once the process group exists): then only those are compared.
    """
    problems = _process_problems(expected, facts)
    if "distributed_type" in facts:
        problems += _engine_problems(expected, facts)
    if "model_class" in facts:
        problems += _model_problems(expected, facts)
    return problems


def _process_problems(expected: dict, facts: dict) -> list[str]:
    asked_ranks, got_ranks = expected["world_size"], facts["world_size"]
    asked_machines, nodes = expected["machines"], facts.get("nodes")
    got_machines = len(set(nodes)) if nodes else asked_machines  # the launcher's environment names no nodes
    if (asked_ranks, asked_machines) == (got_ranks, got_machines):
        return []
    got, why = str(got_ranks), ""
    if got_machines != asked_machines:
        got += f" on {_count(got_machines, 'machine')} ({', '.join(sorted(set(nodes)))})"
        why = ": start launch.sh once on every machine, each with its own MACHINE_RANK"
    if got_ranks == 1 and asked_ranks > 1:
        why = (
            ": the processes did not join one run (`accelerate launch --cpu` and distributed_type MULTI_CPU start "
            "a single process; torchrun on CPU without use_cpu starts independent ones)"
        )
    return [
        f"asked {_count(asked_ranks, 'process', 'processes')} on {_count(asked_machines, 'machine')}, got {got}{why}"
    ]


def _engine_problems(expected: dict, facts: dict) -> list[str]:
    asked, got = expected["engine"], engine_of(facts)
    if asked == "fsdp" and got == "ddp" and "model_class" not in facts:
        return []  # not wrapped yet: FSDP ranks look like DDP ranks until then
    if asked != got:
        why = ""
        if got == "none" and asked == "deepspeed":
            why = (
                " (DeepSpeed starts only through `accelerate launch --config_file accelerate_config.yaml`, "
                "which exports its config)"
            )
        elif got == "none" and expected["world_size"] > 1:
            why = " (the ranks train alone, sharing no gradient: on CPU, training_args.yaml needs use_cpu: true)"
        elif asked == "fsdp":
            why = (
                " (accelerate falls back to DDP where it does not run FSDP: FSDP1 needs GPUs, and train_sft.py runs "
                "FSDP2 on CPU ranks only when the launcher exports an FSDP2 config)"
            )
        return [f"asked {_engine(expected)}, got {_engine(facts, got)} ({facts['distributed_type']}){why}"]
    if "model_class" not in facts:
        return []
    if asked == "deepspeed" and expected["zero_stage"] != facts["zero_stage"]:
        return [f"asked DeepSpeed ZeRO-{expected['zero_stage']}, got ZeRO-{facts['zero_stage']}"]
    asked_sp, got_sp = expected.get("sequence_parallel", 1), facts.get("sequence_parallel", 1)
    if asked == "deepspeed" and asked_sp != got_sp:
        return [
            f"asked {asked_sp} GPUs per sequence (strategy.sequence_parallel), got {got_sp} (accelerate takes it "
            "from accelerate_config.yaml's parallelism_config: launch with --config_file accelerate_config.yaml)"
        ]
    if asked == "fsdp" and expected["fsdp_version"] != facts["fsdp_version"]:
        return [f"asked FSDP{expected['fsdp_version']}, got FSDP{facts['fsdp_version']}"]
    return []


def _model_problems(expected: dict, facts: dict) -> list[str]:
    problems = []
    bits, quantized = expected["bits"], facts.get("quantized_modules") or {}
    wanted_class = {4: "Linear4bit", 8: "Linear8bitLt"}.get(bits)
    if wanted_class and not quantized.get(wanted_class):
        problems.append(f"asked a {bits}-bit base (quantization.bits={bits}), got no {wanted_class} module")
    if expected["trainable_params"] is not None and expected["trainable_params"] != facts["trainable_params"]:
        asked, got = expected["trainable_params"], facts["trainable_params"]
        problems.append(f"asked {asked:,} trainable parameters (PEFT's count for the job), got {got:,}")
    asked_scale, got_scale = expected.get("lora_scaling"), facts.get("lora_scaling")
    if asked_scale is not None and got_scale is not None and not math.isclose(asked_scale, got_scale, rel_tol=1e-6):
        problems.append(f"asked adapters scaled by {asked_scale:.4g} (lora.lora_alpha, lora.r, lora.use_rslora), "
                        f"got {got_scale:.4g}")  # fmt: skip
    if "neftune_noise_alpha" in facts and facts["neftune_noise_alpha"] != expected.get("neftune_noise_alpha"):
        problems.append(f"asked NEFTune noise {expected['neftune_noise_alpha']}, got {facts['neftune_noise_alpha']}")
    return problems


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _engine(facts: dict, engine: str | None = None) -> str:
    engine = engine or facts["engine"]
    if engine == "deepspeed":
        return f"DeepSpeed ZeRO-{facts['zero_stage']}"
    if engine == "fsdp":
        return f"FSDP{facts['fsdp_version']}"
    return ENGINE_NAMES[engine]


def shared_gate_problems(expected: dict, facts: dict) -> list[str]:
    """Rank 0's verdict, shared with every rank (a collective), so that all ranks stop together."""
    import torch.distributed as dist

    problems = gate_problems(expected, facts)
    if dist.is_available() and dist.is_initialized():
        shared = [problems]
        dist.broadcast_object_list(shared, src=0)
        problems = shared[0]
    return problems


def gate_error(problems: list[str]) -> GateError:
    return GateError("sanity gate: " + "; ".join(problems))


def check_processes(expected: dict, distributed_type: str | None = None) -> None:
    """The early part of the gate, before minutes of model loading: processes, machines, engine.

    Without distributed_type (accelerate's, once SFTConfig set up the process group) it reads the
    launcher's environment: a process started alone stops here in a second, instead of failing to
    build a gloo group in SFTConfig.
    """
    if distributed_type is None:
        # The variables accelerate itself reads for the world size (torchrun and accelerate set WORLD_SIZE; MPI the others).
        sizes = [
            os.environ.get(name) for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
        ]
        problems = gate_problems(expected, {"world_size": int(next((n for n in sizes if n), 1))})
    else:
        facts = {
            "world_size": _world_size(),
            "nodes": gather_from_ranks(node_name()),
            "distributed_type": distributed_type,
        }
        problems = shared_gate_problems(expected, facts)
    if problems:
        raise gate_error(problems)


# ---------------------------------------------------------------- a run that stopped making progress

STALL_GAP_FACTOR = 3  # a gap this many times the longest seen (an evaluation) is no stall; the supervisor's too


class StallWatchdog:
    """Every rank watches its own steps (job.launch.stall_minutes): with none for that long, and for 3x the longest
    gap seen, it writes every thread's Python stack to its log once (a stuck rank shows where it waits); with
    launch.stop_when_stalled it then ends the run, as a failure that says so. A thread of its own, which runs while
    the main thread waits in a collective or in C++ (they release the GIL). Checkpoint saves are not watched."""

    def __init__(self, job: dict, run_dir: Path, phase: str | None = None):
        launch = job.get("launch") or {}
        self.after_s = float(launch.get("stall_minutes", 10) or 0) * 60
        self.stop = bool(launch.get("stop_when_stalled"))
        self.errors = run_dir / "errors.jsonl"
        self.phase = phase  # a startup phase watched as steps are (watched_phase), or None: the steps
        self.step, self.beat_at, self.longest_gap = 0, time.monotonic(), 0.0
        self.dumped = False
        self.done = threading.Event()

    def start(self, step: int) -> None:
        if self.after_s > 0:
            self.step, self.beat_at = step, time.monotonic()
            threading.Thread(target=self._watch, name="tunedeck-stall-watchdog", daemon=True).start()

    def beat(self, step: int | None = None) -> None:
        now = time.monotonic()
        if not self.dumped:  # a stall's gap would raise the limit for good
            self.longest_gap = max(self.longest_gap, now - self.beat_at)
        self.beat_at, self.dumped = now, False
        if step is not None:
            self.step = step

    def saved(self) -> None:
        """A checkpoint was saved: the wait starts again, and the save's time is no step's gap."""
        self.beat_at, self.dumped = time.monotonic(), False

    def limit(self) -> float:
        return max(self.after_s, STALL_GAP_FACTOR * self.longest_gap)

    def _watch(self) -> None:
        while not self.done.wait(1.0):
            if CHECKPOINT_SAVING.is_set():  # a save is no stall: the wait starts again when it ends
                self.saved()
                continue
            waited = time.monotonic() - self.beat_at
            if self.dumped or waited <= self.limit():
                continue
            self.dumped = True
            if self.phase:
                stalled = f"stalled: {self.phase} for {waited / 60:.0f} min"
            else:
                stalled = f"stalled: no training step for {waited / 60:.0f} min after step {self.step}"
            print(f"\ntunedeck: {stalled} on rank {global_rank()}; every thread's stack:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            if self.stop:
                error = f"{stalled} (launch.stall_minutes, launch.stop_when_stalled); each rank's stack is in its log"
                JsonlWriter(self.errors).write({"rank": global_rank(), "time": time.time(), "error": error})
                os._exit(STALLED_EXIT)  # the main thread is stuck: nothing else would end this process


@contextlib.contextmanager
def watched_phase(job: dict, run_dir: Path, startup: StartupPhases, phase: str):
    """A startup phase that runs your code (WATCHED_PHASES: a reward module's import), entered and watched as steps
    are: a hang there is a stall (its stack in the log; launch.stop_when_stalled ends the run), where loading a model,
    however long, is not. The supervisor marks the run stalled from startup.json by the same rule."""
    startup.enter(phase)
    watchdog = StallWatchdog(job, run_dir, phase)
    watchdog.start(0)
    try:
        yield
    finally:
        watchdog.done.set()


IMPORTING_REWARDS = "importing the reward functions"
WATCHED_PHASES = (IMPORTING_REWARDS,)  # the supervisor's copy: WATCHED_PHASES
STALLED_EXIT = 3
FORWARDS_TOLD_EVERY_S = 2.0  # how often forward passes reach progress.json (the supervisor checks each second)
CHECKPOINT_SAVING = threading.Event()  # set while a checkpoint is written (with_atomic_checkpoints)


# ---------------------------------------------------------------- the callback


def make_callback(metrics: JsonlWriter | None, stop: StopRequest, job: dict, terminal, expected: dict | None = None):
    from transformers import TrainerCallback

    class RunRecorder(TrainerCallback):
        """Writes the start/log records and turns a stop request into save-and-stop at a step boundary."""

        def __init__(self):
            self.trainer = None
            self.load_peaks: dict = {}  # train() fills it in right after the model loaded
            self.dataset_rows: dict = {}  # and this: the training rows each source gave (dataset.path, dataset.mix)
            self.stopped_early = False
            # Durations on the monotonic clock: a step of the wall clock (NTP, a VM resumed) must not bend them.
            self._last_log = (time.monotonic(), 0)
            self._last_step = 0
            self._first_log: tuple[float, int] | None = None  # (clock, step) of this process's first log record
            self.speed: dict = {}  # speed_facts, at the start of training
            self._per_sequence = 1  # GPUs sharing each sequence (Ulysses), from the start record
            self._step_end = 0.0
            self._fault = _parse_fault(os.environ.get(FAULT_ENV))
            self.watchdog = StallWatchdog(job, Path.cwd())  # train() works in the run folder
            self._micro = 0  # micro-batches done by this process
            self._forwards, self._forwards_told = 0, 0.0  # forward passes, and when progress.json last said so
            self._step = 0
            self.startup = StartupPhases(Path.cwd(), rank=-1)  # train() gives rank 0's; this one writes nothing

        def _progress(self, step: int, saving: bool = False) -> None:
            self._step = step
            if metrics:  # about 0.1 ms a step, so the step a stalled run stopped at is exact
                warning = getattr(self.trainer, "reward_warning", None)  # GRPO: a reward that scored nothing
                with contextlib.suppress(OSError):  # a full disk must not stop training for this
                    write_progress(metrics.path.parent, step, saving, self._micro, self._forwards, warning)

        def forward_done(self) -> None:
            """A forward pass of the model (a hook on its input embeddings): progress inside a micro-batch, where
            GRPO writes its answers a token a pass. Told to progress.json at most every few seconds."""
            self._forwards += 1
            self.watchdog.beat()
            if time.monotonic() - self._forwards_told >= FORWARDS_TOLD_EVERY_S:
                self._forwards_told = time.monotonic()
                self._progress(self._step)

        def on_substep_end(self, args, state, control, **kwargs):
            self._micro += 1  # a micro-batch of gradient accumulation: a long step is progress as they come
            self._progress(state.global_step)
            self.watchdog.beat()

        def on_train_begin(self, args, state, control, **kwargs):
            self._last_log, self._last_step = (time.monotonic(), 0), state.global_step
            record = {**describe_run(self.trainer, job), **self.load_peaks}
            record["dataset_rows"] = self.dataset_rows
            self._per_sequence = record["sequence_parallel"]
            self.speed = speed_facts(
                self.trainer, record["trainable_params"], record["total_params"], record["objective"]
            )
            record.update(self.speed)
            problems = shared_gate_problems(expected, record) if expected else []
            record["gate"] = {"passed": not problems, "problems": problems}
            if metrics:
                metrics.write(record)
            if problems:
                raise gate_error(problems)  # on every rank: the run stops before its first step
            self.startup.enter("the first step")
            self._progress(state.global_step)
            self.watchdog.start(state.global_step)
            self._inject_fault(state.global_step)

        def on_prediction_step(self, args, state, control, **kwargs):
            self.watchdog.beat()  # an evaluation batch is progress too

        def on_save(self, args, state, control, **kwargs):
            self.watchdog.saved()
            self._progress(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            self.watchdog.done.set()
            self._progress(state.global_step, saving=True)  # the final model's save follows: no stall either

        def on_step_end(self, args, state, control, **kwargs):
            self._step_end = time.monotonic()  # evaluation, when due, runs after this
            self.startup.enter("training")  # once: the list closes with it
            self._micro += 1
            self._progress(state.global_step)
            self.watchdog.beat(state.global_step)
            self._inject_fault(state.global_step)
            # Ranks get the signal at slightly different moments: agree, or one rank would wait forever.
            if _any_rank(stop.requested, args.device):
                if state.global_step < state.max_steps:
                    self.stopped_early = True
                control.should_save = True
                control.should_log = True
                control.should_training_stop = True
            return control

        def _inject_fault(self, step: int) -> None:
            """TUNEDECK_FAULT's failure, when it names this rank and step (see _parse_fault)."""
            rank, at, exit_code = self._fault or (None, None, None)
            if at != step or rank not in ("*", str(global_rank())):
                return
            if exit_code is not None:
                print(
                    f"fault injected by {FAULT_ENV}: os._exit({exit_code}) at step {step}", file=sys.stderr, flush=True
                )
                os._exit(exit_code)  # no end record, no error: as a library or a reward calling os._exit would
            raise RuntimeError(f"fault injected by {FAULT_ENV} on rank {global_rank()} at step {step}")

        def _pace(self, step: int) -> dict:
            """Seconds a step from this process's first log record on, for the readers' ETA (their wall-clock
            "time" fields may go backwards); a requeued job's new process starts its own count."""
            now = time.monotonic()
            if self._first_log is None:
                self._first_log = (now, step)
            since, first_step = self._first_log
            return {"seconds_per_step": (now - since) / (step - first_step)} if step > first_step else {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if "loss" not in logs and "eval_loss" not in logs:
                return  # the trainer's closing summary; the end record covers it
            peaks = gpu_peaks_gb()  # collective: every rank takes part
            if not metrics:
                return
            record = {"event": "log", "time": time.time(), "step": state.global_step, "max_steps": state.max_steps}
            record["epoch"] = logs.get("epoch", state.epoch)
            record.update(self._pace(state.global_step))
            if "loss" in logs:
                now, tokens = time.monotonic(), logs.get("num_tokens")
                last_time, last_tokens = self._last_log
                if tokens is not None and now > last_time:
                    record["tokens_per_second"] = (tokens - last_tokens) / (now - last_time)
                    if self.speed.get("peak_tflops"):
                        rows = (state.global_step - self._last_step) * args.per_device_train_batch_size
                        # the GPUs sharing a sequence (Ulysses) read their rows together
                        rows *= args.gradient_accumulation_steps * _world_size() // self._per_sequence
                        rows *= self.speed["flops_inputs"].get("sequences_per_row", 1)  # DPO: two a row
                        seq_len = (tokens - last_tokens) / max(1, rows)  # attention's FLOPs grow with it
                        record.update(utilisation(self.speed, record["tokens_per_second"], seq_len))
                    self._last_log, self._last_step = (now, tokens), state.global_step
                for key in ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "num_tokens"):
                    if key in logs:
                        record[key] = logs[key]
            else:
                # Evaluation trains no tokens: leave its time out of the next tokens/s window.
                last_time, last_tokens = self._last_log
                self._last_log = (last_time + time.monotonic() - max(self._step_end, last_time), last_tokens)
            for key in ("eval_loss", "eval_mean_token_accuracy"):
                if key in logs:
                    record[key] = logs[key]
            record.update(grpo_record(logs))
            # DPO's and KTO's, of the training rows and of the held-out ones
            for key in ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy", "kl"):
                if PREFERENCE_LOGS[key] in logs:
                    record[key] = logs[PREFERENCE_LOGS[key]]
            for key in (
                "eval_reward_chosen",
                "eval_reward_rejected",
                "eval_reward_margin",
                "eval_reward_accuracy",
                "eval_kl",
            ):
                if PREFERENCE_LOGS[key] in logs:
                    record[key] = logs[PREFERENCE_LOGS[key]]
            if peaks:
                record["gpu_peak_allocated_gb"], record["gpu_peak_reserved_gb"] = peaks
            metrics.write(record)
            if "reward" in record:
                write_answers(Path(metrics.path).parent, state.global_step, getattr(self.trainer, "_logs", None))
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


def _parse_fault(text: str | None) -> tuple[str, int, int | None] | None:
    """(rank, step, exit code) when TUNEDECK_FAULT="rank=1,step=2" names a step: that rank ("*": every rank) raises
    there, or with ",exit=0" leaves at once with that exit code."""
    parts = _fault_parts(text)
    if "step" not in parts:
        return None
    return parts["rank"], int(parts["step"]), int(parts["exit"]) if "exit" in parts else None


def _parse_slow_phase(text: str | None, rank: int) -> tuple[str, float] | None:
    """(phase, seconds) when TUNEDECK_FAULT="rank=1,seconds=20,phase=loading the model" names this rank: it stays
    that much longer in that phase, as a slow node would (the phase last: the rest of the text is its name)."""
    parts = _fault_parts(text)
    if "phase" not in parts or int(parts["rank"]) != rank:
        return None
    return parts["phase"], float(parts["seconds"])


def _fault_parts(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    head, _, phase = text.partition(",phase=")
    parts = dict(item.split("=", 1) for item in head.split(","))
    return {**parts, "phase": phase} if phase else parts


# ---------------------------------------------------------------- checkpoints written whole or not at all

INCOMPLETE_DIR = ".incomplete"  # under output_dir: checkpoints being written
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def with_atomic_checkpoints(trainer_class):
    """trainer_class, writing each checkpoint under output_dir/.incomplete/ and renaming it into place when complete.

    transformers' Trainer._save_checkpoint writes straight into output_dir/checkpoint-N, and
    get_last_checkpoint (what resuming loads) takes the highest N that is a folder, complete or
    not: a save cut short by a full disk or a kill would be the checkpoint a resume loads.
    """
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

    class AtomicCheckpoints(trainer_class):
        _staging = None

        def _get_output_dir(self, trial):
            return self._staging or super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            CHECKPOINT_SAVING.set()  # a large save is no stall (StallWatchdog)
            if self.is_world_process_zero():  # nor for the supervisor (on_save writes the step again after it)
                with contextlib.suppress(OSError):
                    write_progress(Path.cwd(), self.state.global_step, saving=True)
            try:
                self._save_atomically(model, trial)
            finally:
                CHECKPOINT_SAVING.clear()

        def _save_atomically(self, model, trial):
            root = super()._get_output_dir(trial)
            staging = os.path.join(root, INCOMPLETE_DIR)
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._staging = staging  # the parent saves, and rotates (a no-op), there
            try:
                super()._save_checkpoint(model, trial)
            except Exception as exc:
                full = _disk_full(root, exc)
                if self.args.should_save:
                    shutil.rmtree(staging, ignore_errors=True)  # give back the space a failed save took
                if not full:
                    raise
                # torch reports it as "[enforce fail at inline_container.cc] unexpected pos ...": say what happened.
                raise JobError(
                    f"output_dir: the disk holding {os.path.abspath(root)} is full: {name} did not fit "
                    f"({type(exc).__name__}: {exc}); free space or set output_dir to a disk with room, then resume "
                    "with training.resume_from_checkpoint (the checkpoints saved before are complete)"
                ) from exc
            finally:
                self._staging = None
            self.accelerator.wait_for_everyone()  # every rank's shards are written
            if not self.args.should_save:
                return
            final = os.path.join(root, name)
            if os.path.isdir(final):
                shutil.rmtree(final)  # an earlier run's checkpoint of the same step, in a reused output_dir
            os.replace(os.path.join(staging, name), final)
            shutil.rmtree(staging, ignore_errors=True)  # leftovers of saves cut short earlier
            best = self.state.best_model_checkpoint
            if best and best.startswith(staging):
                self.state.best_model_checkpoint = os.path.join(root, os.path.basename(best))
                self.state.save_to_json(os.path.join(final, TRAINER_STATE_NAME))
            rotate_checkpoints(root, self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=True)

    return AtomicCheckpoints


def _disk_full(folder: str, exc: BaseException) -> bool:
    if getattr(exc, "errno", None) in DISK_FULL:
        return True
    try:
        return shutil.disk_usage(folder).free < 2**20
    except OSError:  # the folder is gone (deleted under the run): not a full disk
        return False


# ---------------------------------------------------------------- main


def _both_splits(pairs) -> dict:
    """{record key: logged key} of the training rows, and under eval_ of the held-out ones."""
    return {f"{prefix}{key}": f"{prefix}{logged}" for prefix in ("", "eval_") for key, logged in pairs}


# Log record key -> what DPOTrainer and KTOTrainer log (eval_ before both for the held-out rows): the implicit
# rewards beta * log(policy / reference) of the chosen (KTO: good) and rejected (bad) answers, their margin, how
# often chosen wins (DPO), and KTO's estimate of the KL divergence between the model and its reference.
PREFERENCE_LOGS = _both_splits(
    (
        ("reward_chosen", "rewards/chosen"),
        ("reward_rejected", "rewards/rejected"),
        ("reward_margin", "rewards/margins"),
        ("reward_accuracy", "rewards/accuracies"),
        ("kl", "kl"),
    )
)
# Log record key -> what GRPOTrainer logs: the mean and spread of the answers' summed rewards, their mean length
# in tokens, the share cut at grpo.max_completion_length, and the share of prompts whose answers all scored the
# same (nothing to learn from them).
GRPO_LOGS = _both_splits(
    (
        ("reward", "reward"),
        ("reward_std", "reward_std"),
        ("completion_length", "completions/mean_length"),
        ("completions_clipped", "completions/clipped_ratio"),
        ("groups_without_signal", "frac_reward_zero_std"),
    )
)


ANSWERS_FILE = "answers.jsonl"  # rank 0, GRPO: what the model just wrote, scored
ANSWER_GROUPS, ANSWER_CHARS = 2, 2000  # prompts kept a logging step; characters kept of a prompt or an answer


def write_answers(run_dir: Path, step: int, latest: dict | None) -> None:
    """Append the answers GRPOTrainer last wrote to the first ANSWER_GROUPS prompts (its `_logs`: the last
    generation batch of every rank, in order), each with its rewards and advantage, to answers.jsonl."""
    if not latest or not latest.get("prompt"):
        return
    rewards = {name: list(values) for name, values in latest.get("rewards", {}).items()}
    advantages = list(latest.get("advantages", []))
    groups: dict[str, list] = {}
    for i, (prompt, answer) in enumerate(zip(latest["prompt"], latest["completion"])):
        key = _answer_text(prompt)
        if key not in groups and len(groups) == ANSWER_GROUPS:
            break
        groups.setdefault(key, []).append(
            {
                "text": _answer_text(answer)[:ANSWER_CHARS],
                "rewards": {name: values[i] for name, values in rewards.items() if i < len(values)},
                "advantage": advantages[i] if i < len(advantages) else None,
            }
        )
    record = {"step": step, "groups": [{"prompt": p[:ANSWER_CHARS], "answers": a} for p, a in groups.items()]}
    JsonlWriter(run_dir / ANSWERS_FILE).write(record)


def grpo_record(logs: dict) -> dict:
    """GRPO's keys of a log record: GRPO_LOGS, and each reward's mean under "rewards" ("eval_rewards")."""
    record = {key: logs[logged] for key, logged in GRPO_LOGS.items() if logged in logs}
    for prefix in ("", "eval_"):
        start, end = f"{prefix}rewards/", "/mean"
        rewards = {
            name[len(start) : -len(end)]: value
            for name, value in logs.items()
            if name.startswith(start) and name.endswith(end)
        }
        if rewards:
            record[f"{prefix}rewards"] = rewards
    return record


# What each job.objective trains with: TRL's config and trainer classes.
OBJECTIVES = {
    "sft": ("SFTConfig", "SFTTrainer"),
    "dpo": ("DPOConfig", "DPOTrainer"),
    "kto": ("KTOConfig", "KTOTrainer"),
    "grpo": ("GRPOConfig", "GRPOTrainer"),
}


def objective_classes(job: dict) -> tuple[type, type]:
    """(config class, trainer class) of the job's objective: SFT on demonstrations, DPO on preference pairs, KTO on
    answers labelled good or bad."""
    import trl

    objective = job.get("objective") or "sft"
    if objective not in OBJECTIVES:
        raise JobError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    config, trainer = OBJECTIVES[objective]
    return getattr(trl, config), getattr(trl, trainer)


def trainer_class(base):
    """The objective's TRL trainer, which also runs FSDP2 on CPU ranks (over gloo) when the launcher asked for FSDP2.

    DPOTrainer and KTOTrainer with adapters need no reference model: they score the reference with the adapters off.
    GRPOTrainer's rewards of each step are looked at whole: a reward that scored none of them is a warning
    (reward_warning, which rank 0's progress.json carries to the run's state line, and its log).
    """

    class Trainer(base):
        reward_warning: str | None = None

        def _calculate_rewards(self, *args, **kwargs):  # GRPOTrainer's (TRL 1.x): every rank's rewards, gathered
            rewards = super()._calculate_rewards(*args, **kwargs)
            if not self.model.training:  # an evaluation trains nothing either way
                return rewards
            warning = unscored_warning(self.reward_func_names, rewards, self.state.global_step + 1)
            if warning and self.is_world_process_zero():
                self.reward_warning = warning
                print(f"warning: {warning}", file=sys.stderr, flush=True)
            return rewards

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            if _switch_cpu_ranks_to_fsdp2(self.accelerator):
                self.is_fsdp_enabled = True
                if self.accelerator.state.fsdp_plugin.activation_checkpointing and self.args.activation_checkpointing:
                    raise JobError(
                        "training.gradient_checkpointing: FSDP's activation checkpointing is on as well; "
                        "set training.gradient_checkpointing=false and keep strategy.fsdp_activation_checkpointing"
                    )

    return Trainer


def fsdp_launch() -> bool:
    """Whether the launcher asked for FSDP (accelerate exports its config to the ranks' environment)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def _switch_cpu_ranks_to_fsdp2(accelerator) -> bool:
    """Run accelerate's own FSDP2 path (fsdp2_prepare_model: fully_shard per layer) on CPU ranks.

    accelerate 1.15 takes its FSDP branch only for GPU-like distributed types (AcceleratorState in
    accelerate/state.py): on CPU ranks an FSDP launch silently becomes DDP (measured). PyTorch's
    FSDP2 itself runs over gloo, FSDP1 does not ("FSDP needs a non-CPU accelerator device"). So
    when the launcher exported an FSDP2 config (ACCELERATE_USE_FSDP, FSDP_VERSION=2) and the
    ranks are CPU processes, hand accelerate the plugin it would have built from the same
    environment and mark the shared state as FSDP; prepare() then shards with fully_shard.
    Returns True when it switched. The sanity gate checks what the model really got.
    """
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    fsdp2 = fsdp_launch() and os.environ.get("FSDP_VERSION") == "2"
    if state.distributed_type != DistributedType.MULTI_CPU or not fsdp2:
        return False
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* environment, as accelerate builds it
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    # What AcceleratorState itself sets for FSDP; its state is shared, so Accelerator and Trainer see it.
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def requeued() -> bool:
    """Whether this is a Slurm job started again after a requeue (its restart count is above 0)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")


def resume_checkpoint(args, job: dict) -> str | None:
    """The newest checkpoint in output_dir when resuming was asked for, else None (a fresh start)."""
    wanted = args.resume_from_checkpoint or (job.get("training") or {}).get("resume_from_checkpoint")
    if not wanted and requeued():
        wanted = True  # Slurm started this job again (preempted or requeued): go on from where it stopped
    if not wanted:
        return None
    if isinstance(wanted, str) and wanted.lower() not in ("true", "last"):
        return wanted
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    if found is None:  # a first run (or a requeued job that never saved): say so, the step count starts at 0
        print(
            f"resume_from_checkpoint: no checkpoint in {os.path.abspath(args.output_dir)}; starting from step 0",
            flush=True,
        )
    return found


def train(job: dict, training_args: dict, metrics, stop: StopRequest, terminal, startup: StartupPhases) -> str:
    """Run the job; returns "finished" or "stopped"."""
    startup.enter("importing the libraries")
    problems = input_problems(job, Path.cwd())  # a missing model or bad data rows: named before any library sees them
    if problems:
        raise JobError("\n".join(f"{field}: {message}" for field, message in problems))
    expected = expected_run(job)
    check_processes(expected)  # a lone process stops here, before anything heavy
    from accelerate import PartialState

    config_class, trainer_base = objective_classes(job)
    expected["trainable_params"] = expected_trainable(job)  # before SFTConfig: see expected_trainable
    startup.enter("joining the other processes")
    args = config_class(**training_args)  # the process group forms here: every rank waits for the others
    # The process group exists: wrong counts or a missing engine stop here, before the model loads.
    check_processes(expected, str(PartialState().distributed_type.value))
    extra = {}
    if job.get("objective") == "grpo":
        # The rewards score the answers the model writes; a KL weight (beta > 0) makes TRL load the reference itself.
        # Your reward modules run their own code as they are imported: before the model loads, and watched.
        with watched_phase(job, Path.cwd(), startup, IMPORTING_REWARDS):
            extra["reward_funcs"] = reward_functions(job)
    startup.enter("loading the model")
    tokenizer = load_tokenizer(job)
    model = load_model(job, args)
    precomputed = getattr(args, "precompute_ref_log_probs", False)
    if job.get("objective") in REFERENCE_OBJECTIVES and peft_config(job) is None and (not precomputed or fsdp_launch()):
        # Full DPO and KTO score against a frozen copy of the base, loaded as the model is (dtype, quantization,
        # revision; ZeRO-3 shards it as it loads); with adapters the base with the adapters off is the reference.
        # Scores computed before training need no copy (the model scores the rows before its first step), but
        # under FSDP the model is sharded only when training starts: a sharded copy scores them, then goes.
        startup.enter("loading the reference model")
        extra["ref_model"] = load_model(job, args)
    startup.enter("loading the data")
    train_set, eval_set, rows = load_datasets(job, args, tokenizer)
    recorder = make_callback(metrics, stop, job, terminal, expected)
    recorder.startup = startup
    recorder.load_peaks = load_peaks()
    recorder.dataset_rows = rows
    # TRL's trainers tokenize in their constructor (GRPO's does not); DPO's and KTO's score every row with the
    # reference there when the scores are computed before training.
    scoring = ", then scoring every row with the reference" if precomputed else ""
    startup.enter(("tokenizing the data" if job.get("objective") != "grpo" else "building the trainer") + scoring)
    trainer = with_atomic_checkpoints(trainer_class(trainer_base))(
        **extra,
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=peft_config(job),
        callbacks=[recorder],
    )
    if job.get("objective") == "grpo":  # minutes of writing answers inside one micro-batch are no stall
        trainer.model.get_input_embeddings().register_forward_hook(lambda *_: recorder.forward_done())
    if precomputed and extra:  # the scores are in the datasets now: free the copy (TRL keeps one it was given)
        extra.clear()
        trainer.ref_model = None
    recorder.trainer = trainer
    startup.enter("preparing the model and optimizer")  # DeepSpeed or FSDP wraps it; DeepSpeed may compile ops
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
        "--training-args",
        type=Path,
        default=Path("training_args.yaml"),
        help="trl.SFTConfig (DPOConfig, KTOConfig, GRPOConfig) kwargs YAML",
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
    stop = StopRequest(run_dir)
    stop.install()
    terminal = redirect_output(run_dir, rank)
    metrics = JsonlWriter(run_dir / "metrics.jsonl") if rank == 0 else None
    started = time.monotonic()
    status, error = "failed", None
    try:
        job = read_yaml(job_path, "job spec")
        training_args = read_yaml(args_path, "training arguments")
        status = train(job, training_args, metrics, stop, terminal, StartupPhases(run_dir, rank))
    except BaseException as exc:  # noqa: BLE001 - every failure must end the run's record
        if isinstance(exc, JobError):  # the user's input: the message says it all
            error, trace = str(exc), None
            print(f"error: {error}", file=sys.stderr)
        else:
            error, trace = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__), traceback.format_exc()
            traceback.print_exc()
        JsonlWriter(run_dir / "errors.jsonl").write(
            {"rank": rank, "time": time.time(), "error": error, "traceback": trace}
        )
    if metrics:
        metrics.write(
            {
                "event": "end",
                "time": time.time(),
                "status": status,
                "runtime_s": time.monotonic() - started,
                "error": error,
            }
        )
    if terminal:
        print(f"run {status}" + (f": {error}" if error else ""), file=terminal)
    _close_process_group(clean=status != "failed")  # first: the other ranks never wait on a webhook
    if rank == 0:  # after the end record, and bounded in time (under tunedeck's supervisor, it posts instead)
        notify(run_dir, status, error, time.monotonic() - started)
    return 0 if status != "failed" else 1


def notify_target() -> tuple[str, str] | None:
    """(URL, its host) from $TUNEDECK_NOTIFY_URL, None when unset; ValueError when it is not an http(s) URL.
    Only the host is ever printed: the rest of a webhook URL, and a user:password@ in it, is its secret."""
    import urllib.parse

    url = os.environ.get(NOTIFY_ENV, "").strip()
    if not url:
        return None
    where = urllib.parse.urlsplit(url)
    if where.scheme not in ("http", "https") or not where.hostname:
        raise ValueError(f"{NOTIFY_ENV} is not an http(s) URL: no notification will be sent")
    return url, where.hostname


def notify(run_dir: Path, status: str, error: str | None, runtime_s: float) -> None:
    """POST how the run ended to $TUNEDECK_NOTIFY_URL, once, within NOTIFY_DEADLINE_S; never fails the run (a warning
    in the log instead). The caller has recorded the run's end before: whatever the webhook does comes after."""
    try:
        target = notify_target()
    except ValueError as exc:
        print(f"warning: {exc}", file=sys.stderr, flush=True)
        return
    if target is None:
        return
    url, host = target
    last = _last_loss_record(run_dir / "metrics.jsonl")
    body = notification(run_dir.name, status, error, runtime_s, last, webhook_service(url))
    problem = post_within(url, body, NOTIFY_DEADLINE_S)
    if problem:  # the URL's path may hold its secret: only its host is named
        print(f"warning: the notification to {host} failed: {problem}", file=sys.stderr, flush=True)


# Each chat service's webhook, by its host or (behind a proxy, or a local stand-in) by the shape of its path.
WEBHOOK_SERVICES = (
    ("slack", re.compile(r"^hooks\.slack\.com$"), re.compile(r"^/services/T[\w-]+/B[\w-]+/[\w-]+$")),
    ("discord", re.compile(r"^(?:\w+\.)?discord(?:app)?\.com$"), re.compile(r"^/api/webhooks/\d+/[\w-]+$")),
    ("teams", re.compile(r"^(?:[\w-]+\.webhook\.office\.com|outlook\.office\.com)$"), re.compile(r"^/webhookb2/")),
)


def webhook_service(url: str) -> str | None:
    """ "slack", "discord" or "teams" when the URL is that service's incoming webhook; None for any other endpoint."""
    import urllib.parse

    where = urllib.parse.urlsplit(url)
    host = (where.hostname or "").lower()
    return next((name for name, hosts, paths in WEBHOOK_SERVICES if hosts.match(host) or paths.match(where.path)), None)


def notification(
    run: str, status: str, error: str | None, runtime_s: float, last: dict | None, service: str | None
) -> dict:
    """The JSON a webhook gets: one line of text, and the facts as fields. The text carries the run's error, which
    may hold anything (a data file's name, a reward's output): it is escaped as the service reads it, so that no
    `<!channel>`, `@everyone` or link in it pings a channel or hides where it leads."""
    minutes, seconds = divmod(int(runtime_s), 60)
    text = f"tunedeck run {run} {status} after {minutes // 60}:{minutes % 60:02d}:{seconds:02d}"
    if last:
        text += f" · step {last['step']}/{last.get('max_steps', '?')} · loss {last['loss']:.4f}"
    text += f" · {error[:500]}" if error else ""
    text = WEBHOOK_ESCAPES.get(service, str)(text)
    body = {
        "text": text,  # Slack, Teams and most webhooks show "text"; Discord shows "content"
        "content": text[:2000],  # Discord's limit
        "run": run,
        "state": status,
        "step": last and last["step"],
        "max_steps": last and last.get("max_steps"),
        "loss": last and last["loss"],
        "error": error,
        "runtime_s": round(runtime_s, 1),
    }
    if service == "discord":
        # https://discord.com/developers/docs/resources/webhook#execute-webhook: allowed_mentions with an empty
        # "parse" pings nobody whatever the content says (resources/message#allowed-mentions-object); flags 4 is
        # SUPPRESS_EMBEDS, one of the two flags a webhook may set: no preview of a link in the error.
        body.update(allowed_mentions={"parse": []}, flags=4)
    return body


def slack_text(text: str) -> str:
    """Slack reads &, < and > as control characters in a message's text (<!channel>, <@U123>, <https://x|a link>) and
    asks for exactly those three as HTML entities, nothing else encoded:
    https://api.slack.com/reference/surfaces/formatting#escaping"""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


DISCORD_MARKDOWN = re.compile(r"([\\*_~`|>#\-\[\]()<@])")


def discord_text(text: str) -> str:
    """Discord's message markdown (https://support.discord.com/hc/en-us/articles/210298617): a backslash before a
    markdown character shows it as itself, so no [text](url) masks a link, no <@id> or <#id> mentions, no heading or
    quote. Pings are off by allowed_mentions as well (notification)."""
    return DISCORD_MARKDOWN.sub(r"\\\1", text)


TEAMS_MARKDOWN = re.compile(r"([\\*_~`#\-+!|\[\]()])")


def teams_text(text: str) -> str:
    """A Teams incoming webhook's card text takes Markdown and a subset of HTML
    (https://learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/cards-format): HTML's &, < and >
    as entities, and a backslash before each Markdown character, so no tag, [text](url) link or image renders."""
    return TEAMS_MARKDOWN.sub(r"\\\1", slack_text(text))


WEBHOOK_ESCAPES = {"slack": slack_text, "discord": discord_text, "teams": teams_text}


def post_within(url: str, body: dict, deadline_s: float) -> str | None:
    """POST `body` as JSON, all of it (connecting, sending, the answer) within deadline_s; the problem, or None.

    urllib's timeout bounds each socket read alone, so the POST runs in a thread of its own, left behind when the
    deadline passes (a daemon thread: it ends with the process). A user:password@ in the URL becomes HTTP basic
    auth: urllib takes no credentials from a URL (http.client reads "pass@host" as the port)."""
    import base64
    import urllib.parse
    import urllib.request

    where = urllib.parse.urlsplit(url)
    headers = {"Content-Type": "application/json", "User-Agent": "tunedeck"}
    if where.username is not None:
        login = f"{urllib.parse.unquote(where.username)}:{urllib.parse.unquote(where.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode("ascii")
        url = urllib.parse.urlunsplit(where._replace(netloc=where.netloc.rpartition("@")[2]))
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    outcome: list[str | None] = []

    def post() -> None:
        try:
            urllib.request.urlopen(request, timeout=deadline_s).close()
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is a warning: the run's end is recorded
            outcome.append(str(exc) or type(exc).__name__)

    thread = threading.Thread(target=post, name="tunedeck-notify", daemon=True)
    thread.start()
    thread.join(deadline_s)
    return outcome[0] if outcome else f"no whole answer within {deadline_s:g} s"


def _last_loss_record(path: Path) -> dict | None:
    """The newest log record with a training loss, from the end of metrics.jsonl."""
    return last_record(path, lambda record: record.get("event") == "log" and "loss" in record)


def last_record(path: Path, wanted, tail_bytes: int = 65536) -> dict | None:
    """The newest JSON object of a .jsonl file that wanted(record) accepts, read from its last tail_bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the tail's first line may be cut
        if isinstance(record, dict) and wanted(record):
            return record
    return None


def _close_process_group(clean: bool) -> None:
    """End every process group now, while the interpreter is whole.

    Without the barrier, ranks tearing down at different moments occasionally abort at exit. A group
    that outlives this call is destroyed in the interpreter's teardown, where a gloo thread calling
    into Python can abort the process after the run has finished (the likely cause of "terminate
    called without an active exception" after a finished Ulysses run, seen once in CI). DeepSpeed
    keeps its own references to the groups it made (Ulysses' sequence groups among them): its
    destroy_process_group releases them, torch's does not; gc.collect() then frees the trainer's
    cycles that still hold a group.
    """
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            if clean:
                dist.barrier()
            deepspeed_comm = sys.modules.get("deepspeed.comm")
            if deepspeed_comm is not None and deepspeed_comm.is_initialized():
                deepspeed_comm.destroy_process_group()
            else:
                dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - the end is recorded: a peer gone first must not fail this rank
            print(f"warning: closing the process group: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    gc.collect()


if __name__ == "__main__":
    sys.exit(main())
