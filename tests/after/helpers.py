"""Helpers of the after-training tests: train a demo run, run the CLI, compare logits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

PROMPTS_COMPARED = 16
CHAT_SYSTEM = "Answer with the number."  # the chat run's data's system message


def train_demo(runs_dir: Path, overrides: dict) -> tuple[Path, str]:
    """(runs_dir, run_id) of a finished demo run with these dotted-path overrides."""
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths

    spec = resolve_spec("demo")
    spec = set_paths(spec, overrides) if overrides else spec
    manager = RunManager(runs_dir)
    run_id = manager.start(spec)
    status = manager.wait(run_id, timeout=900)
    assert status.state == "finished", f"{status.state}: {status.error}"
    return Path(runs_dir), run_id


def tunedeck(*args, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """The `tunedeck` command of this environment, as a user runs it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "tunedeck"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def eval_prompts(demo_home: Path) -> list[str]:
    rows = (demo_home / "data" / "eval.jsonl").read_text().splitlines()[:PROMPTS_COMPARED]
    return [json.loads(row)["prompt"] for row in rows]


def peft_logits(base_dir: Path, adapter_dir: Path | None, prompts: list[str]):
    """Logits of base + adapter through PEFT (the base alone without adapter_dir), in float32 and not quantized."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = (PeftModel.from_pretrained(model, str(adapter_dir)) if adapter_dir else model).eval()
    with torch.no_grad():
        return [model(**tokenizer(p, return_tensors="pt")).logits[0] for p in prompts]


MERGED_PROBE = textwrap.dedent(
    """
    import json, sys
    sys.modules["peft"] = None          # importing either now fails: the model must load without them
    sys.modules["bitsandbytes"] = None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, prompts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = [model(**tokenizer(p, return_tensors="pt")).logits[0] for p in prompts]
    torch.save(logits, out)
    print(json.dumps({"class": type(model).__name__, "quantization_config": getattr(model.config, "quantization_config", None)}))
    """
)


def merged_logits(folder: Path, prompts: list[str], scratch: Path):
    """(logits, facts) of a merged model loaded by transformers in a process where peft and bitsandbytes cannot be imported."""
    import torch

    out = scratch / "merged_logits.pt"
    result = subprocess.run(
        [sys.executable, "-c", MERGED_PROBE, str(folder), json.dumps(prompts), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out), json.loads(result.stdout.strip().splitlines()[-1])


def max_difference(first, second) -> float:
    assert len(first) == len(second)
    return max(float((a - b).abs().max()) for a, b in zip(first, second))


def gone(pid: int) -> bool:
    """True when no live process has this pid (a zombie counts as gone: it holds no memory)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
