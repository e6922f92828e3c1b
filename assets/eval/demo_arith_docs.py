"""The rows of the demo_arith task (demo_arith.yaml): demo_arith.jsonl beside this file, read without the Hub.

demo_arith.jsonl holds the arithmetic rows of the demo's held-out file (<demo_home>/data/eval.jsonl, as
backend/data/demo.py built it from assets/demo/recipe.yaml): {"question": "Add the numbers. 3 + 1", "answer": "4"}.
It is a fixed copy, so the task reads the same questions on every machine whether or not the demo is built.
lm-evaluation-harness calls `load` for the task's `custom_dataset` with its metadata and dataset_kwargs.
"""

import json
from pathlib import Path

ROWS = Path(__file__).with_name("demo_arith.jsonl")


def load(**_):
    import datasets

    rows = [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
