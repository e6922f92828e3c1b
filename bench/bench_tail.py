"""Incremental tail (backend/runs/tail.py) vs re-reading the whole metrics file on every tick.

The panel polls a run's metrics.jsonl about once a second. This measures one tick,
side by side, for files of growing length: JsonlTail reads only the bytes appended
since the last tick; the naive reader opens the file and parses every line again.

    .venv/bin/python bench/bench_tail.py [--ticks 30] [--per-tick 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tunedeck.backend.runs.tail import JsonlTail


def record(step: int) -> str:
    return (
        json.dumps(
            {
                "event": "log",
                "time": 1_700_000_000 + step * 0.5,
                "step": step,
                "max_steps": 10**6,
                "epoch": step / 5000,
                "loss": 2.0 + 1.0 / (1 + step),
                "learning_rate": 2e-4,
                "grad_norm": 0.75,
                "tokens_per_second": 12345.6,
                "mean_token_accuracy": 0.61,
                "num_tokens": step * 4096.0,
            }
        )
        + "\n"
    )


def read_everything(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def measure(lines: int, ticks: int, per_tick: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        path.write_text("".join(record(i) for i in range(lines)))
        tail = JsonlTail(path)
        tail.read_new()  # the page opened: the first read takes everything once
        step = lines
        incremental = naive = 0.0
        for _ in range(ticks):
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(record(step + i) for i in range(per_tick)))
            step += per_tick
            began = time.perf_counter()
            new = tail.read_new()
            incremental += time.perf_counter() - began
            began = time.perf_counter()
            everything = read_everything(path)
            naive += time.perf_counter() - began
            assert len(new) == per_tick and len(everything) == step
        return incremental / ticks, naive / ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--per-tick", type=int, default=5, help="records appended between two ticks")
    args = parser.parse_args()
    print(f"one tick, {args.per_tick} new records, mean of {args.ticks} ticks")
    print(f"{'records in file':>16}  {'tail.py (ms)':>12}  {'re-read all (ms)':>16}  {'ratio':>8}")
    for lines in (1_000, 10_000, 100_000, 300_000):
        incremental, naive = measure(lines, args.ticks, args.per_tick)
        print(f"{lines:>16,}  {incremental * 1e3:>12.3f}  {naive * 1e3:>16.3f}  {naive / incremental:>7.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
