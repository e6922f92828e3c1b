"""Full DPO with its reference kept beside the model vs scored once before training (precompute_ref_log_probs).

The same full DPO job, on the same random-weight Llama and the demo's preference pairs, through the
same bundle launch (`bash launch.sh`: accelerate, 2 CPU ranks, DDP over gloo), twice per repeat in
alternating order: once as tunedeck generates it (a frozen reference copy on every rank, a reference
forward pass in every step), once with preference.precompute_ref_log_probs=true (every row scored before
the first step, then no reference). Reported per variant: the largest rank's peak resident memory over
the whole run (the kernel's count, read with getrusage after the launch ends), the training steps per
second (from the run's own log records, after the first), the wall time, and the per-step losses (the
reference's scores are the same numbers, so the two runs must learn alike).

    .venv/bin/python bench/bench_reference.py [--steps 30] [--repeats 2] [--json report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tunedeck.backend.data.demo import ensure_demo
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import resolve_spec

VARIANTS = {"reference kept": "false", "scored before training": "true"}
# Runs one launch and prints the largest descendant's peak RSS: the ranks' ru_maxrss reaches the parent
# through each wait() on the way up (accelerate -> torchrun -> ranks).
MEASURE = (
    "import resource, subprocess, sys; code = subprocess.run(['bash', 'launch.sh']).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def build_model(folder: Path, demo: Path) -> int:
    """A random-weight Llama large enough that a copy of it shows in a rank's memory (about 30M parameters)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.num_parameters()


def bundle(folder: Path, model_dir: Path, steps: int, precompute: str) -> Path:
    spec = resolve_spec(
        "demo-dpo",
        [
            "method=full",
            f"model.name_or_path={model_dir}",
            f"training.max_steps={steps}",
            "training.per_device_train_batch_size=4",
            "training.learning_rate=1e-5",
            "training.save_steps=100000",
            "dataset.eval_split=null",
            f"preference.precompute_ref_log_probs={precompute}",
        ],
    )
    folder.mkdir(parents=True)
    for name, text in render_bundle(spec).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def run(folder: Path, timeout: float) -> dict:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    env["HF_DATASETS_CACHE"] = str(folder / "datasets-cache")  # each run scores its own rows, none reused
    started = time.time()
    result = subprocess.run(
        [sys.executable, "-c", MEASURE], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.time() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{folder.name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    (start,) = [r for r in records if r.get("event") == "start"]
    logs = [r for r in records if r.get("event") == "log" and "loss" in r]
    return {
        "reference": start["reference"],
        "peak_rss_mib": int(result.stdout.split()[-1]) / 1024,
        "steps_per_s": (logs[-1]["step"] - logs[0]["step"]) / (logs[-1]["time"] - logs[0]["time"]),
        "wall_s": wall,
        "losses": [r["loss"] for r in logs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    demo = ensure_demo()
    with tempfile.TemporaryDirectory(prefix="tunedeck-bench-reference-") as tmp:
        work = Path(tmp)
        parameters = build_model(work / "model", demo)
        results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        for repeat in range(args.repeats):
            order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                folder = bundle(work / f"{repeat}-{VARIANTS[name]}", work / "model", args.steps, VARIANTS[name])
                results[name].append(run(folder, timeout=1800))
                print(f"repeat {repeat + 1} {name}: {results[name][-1]['peak_rss_mib']:.0f} MiB, "
                      f"{results[name][-1]['steps_per_s']:.2f} steps/s", flush=True)  # fmt: skip
    kept, scored = (results[name] for name in VARIANTS)
    median = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    report = {
        "parameters": parameters,
        "steps": args.steps,
        "repeats": args.repeats,
        "variants": {
            name: {
                "reference": runs[0]["reference"],
                "peak_rss_mib": round(median(runs, "peak_rss_mib")),
                "steps_per_s": round(median(runs, "steps_per_s"), 3),
                "wall_s": round(median(runs, "wall_s"), 1),
            }
            for name, runs in results.items()
        },
        "peak_rss_saved_mib": round(median(kept, "peak_rss_mib") - median(scored, "peak_rss_mib")),
        "model_copy_mib": round(parameters * 4 / 2**20),  # fp32 weights
        "steps_per_s_ratio": round(median(scored, "steps_per_s") / median(kept, "steps_per_s"), 3),
        "largest_loss_difference": max(abs(a - b) for a, b in zip(kept[0]["losses"], scored[0]["losses"], strict=True)),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
