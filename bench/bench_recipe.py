"""tunedeck's generated training settings vs seed 002's recipe: useful tokens per second, same learning.

Seed 002 (the guide tunedeck was conceived from) pads every row to max_length
(`padding="max_length"`), does not pack, and trains micro-batches of 1 with 8 accumulation
steps and plain `adamw_torch`. tunedeck's job packs rows (best-fit decreasing, no padding) and
keeps transformers' fused AdamW. Both train the same LoRA on the same model and rows, one epoch,
through the same bundle launch (`bash launch.sh`: accelerate, 2 CPU ranks, DDP over gloo); the
seed's differences are written into the bundle's training_args.yaml. tunedeck's job takes about
the same tokens per optimizer step as the seed's (accumulation steps chosen from the mean row
length), so both take about as many steps and learn alike.

The rows are built here (no download): a prompt-completion task whose lengths are drawn like a
chat dataset's (log-normal: many short rows, a long tail up to max_length). Reported per recipe:
useful (non-padding) tokens per second over the training steps (from the run's metrics.jsonl,
TRL's num_tokens), the final eval loss on held-out rows (completion tokens only, measured
afterwards the same way for both), and the ratio.

    .venv/bin/python bench/bench_recipe.py [--rows 600] [--max-len 384] [--json report.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tunedeck.backend.data.demo import ensure_demo
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import resolve_spec

LETTERS = "abcdefgh"
UNPACKED_BATCH = ["training.per_device_train_batch_size=4", "training.gradient_accumulation_steps=2"]
SEED_TRAINING_ARGS = {  # seed 002: micro-batch 1, 8 accumulation steps, every row padded to max_length
    "packing": False,
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 8,
    "optim": "adamw_torch",
}


def make_rows(rng: random.Random, count: int, max_len: int) -> list[dict]:
    """Letter reversals whose lengths follow a chat dataset's spread: median about max_len/6, a long tail."""
    rows = []
    for _ in range(count):
        letters = max(2, min(int(rng.lognormvariate(math.log(max_len / 12), 0.8)), max_len // 2 - 8))
        sequence = [rng.choice(LETTERS) for _ in range(letters)]
        rows.append(
            {
                "prompt": f"Q: Reverse the letters. {' '.join(sequence)}\nA:",
                "completion": " " + " ".join(reversed(sequence)),
            }
        )
    return rows


def build_model(folder: Path, demo: Path, max_len: int) -> None:
    """A small random Llama with the demo's tokenizer and room for max_len tokens."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(demo / "model", model_max_length=max_len)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.25)  # as the demo: a frozen head that can become confident
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def token_lengths(model_dir: Path, rows: list[dict], max_len: int) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [min(len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) + 1, max_len) for r in rows]


def bundle(folder: Path, model_dir: Path, data: Path, max_len: int, lr: float, overrides: list[str]) -> Path:
    """tunedeck's own bundle for the job: the demo's LoRA on 2 CPU ranks, on this model and data."""
    spec = resolve_spec(
        "demo",
        [
            f"model.name_or_path={model_dir}",
            f"dataset.path={data}",
            f"dataset.max_seq_length={max_len}",
            "training.max_steps=-1",
            "training.num_train_epochs=1",
            f"training.learning_rate={lr}",
            "training.save_steps=100000",
            *overrides,
        ],
    )
    folder.mkdir(parents=True)
    for name, text in render_bundle(spec).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def as_seed_recipe(folder: Path, max_len: int) -> None:
    """Rewrite the bundle's SFTConfig arguments as seed 002 trains: pad every row to max_length, no packing."""
    path = folder / "training_args.yaml"
    args = yaml.safe_load(path.read_text(encoding="utf-8"))
    args.update(SEED_TRAINING_ARGS, pad_to_multiple_of=max_len)
    path.write_text(yaml.safe_dump(args, sort_keys=False), encoding="utf-8")


def run(folder: Path, timeout: float) -> dict:
    """`bash launch.sh` bare; useful tokens/s over the logged steps (after the first) from its metrics."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    started = time.time()
    result = subprocess.run(["bash", "launch.sh"], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{folder.name} failed (exit {result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    logs = [
        r
        for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
        if r.get("event") == "log" and "num_tokens" in r
    ]
    first, last = logs[0], logs[-1]
    return {
        "steps": last["step"],
        "tokens": last["num_tokens"],
        "tokens_per_s": (last["num_tokens"] - first["num_tokens"]) / (last["time"] - first["time"]),
        "train_loss": last["loss"],
        "wall_s": wall,
    }


def padded_share(lengths: list[int], micro_batch: int, accumulation: int, grouped: bool) -> float:
    """Share of padding in micro-batches padded to their longest row, in the order the trainer's sampler gives."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    generator = torch.Generator().manual_seed(0)
    if grouped:  # as Trainer builds it for train_sampling_strategy=group_by_length
        order = list(LengthGroupedSampler(micro_batch * accumulation, lengths=lengths, generator=generator))
    else:
        order = torch.randperm(len(lengths), generator=generator).tolist()
    batches = [[lengths[i] for i in order[start : start + micro_batch]] for start in range(0, len(order), micro_batch)]
    return 1 - sum(map(sum, batches)) / sum(max(b) * len(b) for b in batches)


def fused_adamw_speedup(parameters: int = 8_000_000, steps: int = 20) -> float:
    """Step time of torch's AdamW (foreach, what adamw_torch runs) over the fused kernel, single process."""
    import torch

    def step_time(fused: bool) -> float:
        torch.manual_seed(0)
        weights = [torch.nn.Parameter(torch.randn(1000, parameters // 8000)) for _ in range(8)]
        for w in weights:
            w.grad = torch.randn_like(w)
        optimizer = torch.optim.AdamW(weights, lr=1e-4, fused=fused, foreach=None if fused else True)
        optimizer.step()  # state allocated outside the timing
        started = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        return time.perf_counter() - started

    return step_time(False) / step_time(True)


def eval_loss(model_dir: Path, adapter: Path, rows: list[dict], max_len: int) -> float:
    """Mean cross-entropy of the completion tokens of held-out rows, one unpadded row at a time."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), adapter
    ).eval()
    total, count = 0.0, 0
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        ids = tokenizer(row["prompt"] + row["completion"])["input_ids"][: max_len - 1] + [tokenizer.eos_token_id]
        labels = torch.tensor([-100] * len(prompt) + ids[len(prompt) :])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        total += torch.nn.functional.cross_entropy(logits, labels[1:], ignore_index=-100, reduction="sum").item()
        count += int((labels[1:] != -100).sum())
    return total / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=600, help="training rows (default 600)")
    parser.add_argument("--eval-rows", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=384, help="max_seq_length of both recipes (default 384)")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per training run")
    parser.add_argument(
        "--unpacked", action="store_true", help="also train unpacked, grouped by length and not (group_by_length_ratio)"
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--keep", type=Path, help="keep the bundles and runs in this folder")
    args = parser.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-recipe-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        rng = random.Random(14)
        rows, held_out = make_rows(rng, args.rows, args.max_len), make_rows(rng, args.eval_rows, args.max_len)
        data = work / "data" / "train.jsonl"
        data.parent.mkdir()
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        model_dir = work / "model"
        build_model(model_dir, ensure_demo(), args.max_len)
        lengths = sorted(token_lengths(model_dir, rows, args.max_len))
        # tunedeck's accumulation for about the seed's tokens per step: 8 rows of the mean length per rank.
        accumulation = max(
            1, round(SEED_TRAINING_ARGS["gradient_accumulation_steps"] * sum(lengths) / len(lengths) / args.max_len)
        )

        packed = ["training.per_device_train_batch_size=1", f"training.gradient_accumulation_steps={accumulation}"]
        recipes = {"seed_002": packed, "tunedeck": packed}
        if args.unpacked:
            # Without packing, micro-batches of 4 rows (2 accumulation steps: the seed's 8 rows per step),
            # padded to their longest row: sorted by length (tunedeck's default then) or not.
            unpacked = ["dataset.packing=false", *UNPACKED_BATCH]
            recipes["unpacked_grouped"] = unpacked
            recipes["unpacked_random"] = [*unpacked, "training.group_by_length=false"]
        results = {}
        for name, overrides in recipes.items():
            folder = bundle(work / name, model_dir, data, args.max_len, args.lr, overrides)
            if name == "seed_002":
                as_seed_recipe(folder, args.max_len)
            results[name] = run(folder, args.timeout)
            results[name]["eval_loss"] = eval_loss(model_dir, folder / "output", held_out, args.max_len)
            results[name]["training_args"] = {
                k: v
                for k, v in yaml.safe_load((folder / "training_args.yaml").read_text()).items()
                if k
                in (
                    "packing",
                    "per_device_train_batch_size",
                    "gradient_accumulation_steps",
                    "optim",
                    "pad_to_multiple_of",
                    "train_sampling_strategy",
                )
            }
        report = {
            "rows": args.rows,
            "max_len": args.max_len,
            "row_tokens": {
                "median": lengths[len(lengths) // 2],
                "p95": lengths[int(len(lengths) * 0.95)],
                "max": lengths[-1],
            },
            "padding_share_seed": 1 - sum(lengths) / (len(lengths) * args.max_len),
            **results,
            "tokens_per_s_ratio": results["tunedeck"]["tokens_per_s"] / results["seed_002"]["tokens_per_s"],
            "eval_loss_difference": results["tunedeck"]["eval_loss"] - results["seed_002"]["eval_loss"],
            "adamw_fused_step_speedup": fused_adamw_speedup(),
        }
        if args.unpacked:
            grouped, unsorted = results["unpacked_grouped"], results["unpacked_random"]
            report["group_by_length_ratio"] = grouped["tokens_per_s"] / unsorted["tokens_per_s"]
        micro, accumulation = (int(o.split("=")[1]) for o in UNPACKED_BATCH)
        report["padding_share_unpacked"] = {
            "grouped": padded_share(lengths, micro, accumulation, grouped=True),
            "random": padded_share(lengths, micro, accumulation, grouped=False),
        }
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(
        f"\nuseful tokens/s: tunedeck {report['tunedeck']['tokens_per_s']:,.0f} vs seed 002 "
        f"{report['seed_002']['tokens_per_s']:,.0f} = {report['tokens_per_s_ratio']:.2f}x; eval loss "
        f"{report['tunedeck']['eval_loss']:.3f} vs {report['seed_002']['eval_loss']:.3f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
