"""Run folders with hostile text in every place a run carries text, for test_browser_untrusted.py.

Written as the supervisor, train.py and the page write them (status.json, notes.json, job.yaml, metrics.jsonl,
answers.jsonl, startup.json, eval.json, a LoRA output folder), with no training: a GRPO run (its facts, summary,
answers and reward chart) and a LoRA run with an adapter to try (its data file and base model named with markup).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml

# Each payload drew something in the page before issue 32: an image from any address (and a script through its
# onerror), a form that posts to another host, a link, emphasis, code, a table cell's pipe.
IMG = "<img src=x onerror=alert(1)>"
FORM = "<form action=http://evil.example><input name=t></form>"
MARKDOWN = "![x](http://evil.example/p.png) [click](http://evil.example) www.evil.example `a` *bold* | table |"
HOSTILE = f"{IMG} {FORM} {MARKDOWN} snake_case_name"  # "_" between letters: no emphasis, left as is
# A file or folder name holds no "/": the same attacks without it ("http:host" is http://host to a browser).
IN_A_NAME = (
    "<img src=x onerror=alert(1)><form action=http:evil.example><input name=t> [click](http:evil.example) `a` *b*"
)
NAME = "![x](http://evil.example/p.png) *bold* <img src=x onerror=alert(1)>"  # a run's name: 80 characters at most
PLOTTED = "<b>r</b><a href='http://evil.example'>x</a>"  # Plotly draws <b> and <a href> in a trace's name
REWARD_FILE = f"{IN_A_NAME}.py"  # a custom reward: its file's name is in the run's facts
# A data file's name: no glob characters either (datasets reads data_files as a pattern: "[", "*" and "?").
DATA_NAME = "<img src=x onerror=alert(1)><form action=http:evil.example><input name=t> www.evil.example `a` _b_"

GRPO_RUN = "20250101-120000-a0a0a0"
LORA_RUN = "20250101-110000-b0b0b0"
START = {"event": "start", "world_size": 2, "distributed_type": "MULTI_CPU", "method": "lora",
         "model_class": "DistributedDataParallel", "objective": "grpo", "reference": None, "max_steps": 20}  # fmt: skip


def _status(run_dir: Path, run_id: str, title: str) -> None:
    from tunedeck.backend.runs.supervisor import write_status

    now = time.time()
    write_status(run_dir, {"run_id": run_id, "state": "finished", "title": title, "created_at": now - 60,
                           "started_at": now - 50, "ended_at": now - 10, "exit_code": 0, "error": None})  # fmt: skip


def _job(preset: str, overrides: dict) -> dict:
    from tunedeck.backend.render import render_bundle
    from tunedeck.backend.spec import resolve_spec

    return {**yaml.safe_load(render_bundle(resolve_spec(preset))["job.yaml"]), **overrides}


def grpo_run(runs_dir: Path) -> None:
    """A finished GRPO run: hostile title, name, custom reward file, reward names, answers and a startup phase."""
    from tunedeck.backend.runs.notes import write_notes

    run_dir = runs_dir / GRPO_RUN
    (run_dir / "logs").mkdir(parents=True)
    _status(run_dir, GRPO_RUN, HOSTILE)
    write_notes(run_dir, NAME, HOSTILE)
    job = _job("demo-grpo", {})
    job["grpo"] = {**job["grpo"], "rewards": ["exact_answer", f"/rewards/{REWARD_FILE}:score"]}
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job))
    logs = [{"event": "log", "time": 1000.0 + step, "step": step, "max_steps": 20, "loss": 0.001, "reward": 0.1 * step,
             "rewards": {"exact_answer": 0.05 * step, PLOTTED: 0.04 * step}} for step in (1, 5, 10)]  # fmt: skip
    end = {"event": "end", "status": "finished", "runtime_s": 40.0}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [START, *logs, end]))
    answers = [
        {"text": text, "rewards": {"exact_answer": 1.0, PLOTTED: 0.5}, "advantage": 0.7} for text in (HOSTILE, "7")
    ]
    record = {"step": 10, "groups": [{"prompt": f"Q: {HOSTILE}", "answers": answers}]}
    (run_dir / "answers.jsonl").write_text(json.dumps(record) + "\n")
    phases = [{"phase": "importing the libraries", "at": 100.0}, {"phase": HOSTILE, "at": 101.0},
              {"phase": "training", "at": 105.0}]  # fmt: skip
    (run_dir / "startup.json").write_text(json.dumps({"phases": phases}))
    (run_dir / "logs" / "rank0.log").write_text("training...\n")


def lora_run(runs_dir: Path, demo_home: Path) -> tuple[Path, Path]:
    """A finished LoRA run with an adapter to try (the demo's tokenizer beside it), its base model and its data file
    named with markup, an evaluation of a model named with markup, and a merged folder to push.
    Returns (the data file, the base model's path)."""
    folder = runs_dir.parent / "hostile-files"
    data = folder / f"{DATA_NAME}.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt": f"Q: {HOSTILE} {i}", "completion": " A"}) + "\n" for i in range(3)))
    base = folder / IN_A_NAME / "model"  # never made: loading it fails, after the line that names it
    run_dir = runs_dir / LORA_RUN
    (run_dir / "output").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    _status(run_dir, LORA_RUN, f"{IN_A_NAME} · lora · ddp · 2xCPU")
    job = _job("demo", {"model": {**_job("demo", {})["model"], "name_or_path": str(base)}})
    job["dataset"] = {**job["dataset"], "path": str(data), "eval_split": None}
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job))
    (run_dir / "metrics.jsonl").write_text(json.dumps({**START, "objective": "sft"}) + "\n")
    (run_dir / "logs" / "rank0.log").write_text("training...\n")
    (run_dir / "output" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (run_dir / "output" / "adapter_model.safetensors").write_bytes(b"")  # never read: the base fails first
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the worker loads the tokenizer saved with the adapter
        shutil.copy(demo_home / "model" / name, run_dir / "output" / name)
    result = {"loss": 1.2, "exact_match": 0.5, "rouge_l": 0.4, "examples": 3, "data": str(data), "device": IMG,
              "evaluated_at": 1.0}  # fmt: skip
    (run_dir / "eval.json").write_text(json.dumps({"version": 1, "results": {PLOTTED: result}}))
    merged = run_dir / "merged" / "model"
    merged.mkdir(parents=True)
    (merged / "config.json").write_text("{}")
    return data, base
