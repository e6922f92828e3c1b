"""The speed prediction against published, measured throughput (tests/data/measured_throughput.yaml).

The comparison lives in bench/speed_accuracy.py, the command docs/estimates.md quotes, so the test
and the guide's figure cannot drift apart.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tunedeck.backend import catalog, flops

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("speed_accuracy", ROOT / "bench" / "speed_accuracy.py")
accuracy = importlib.util.module_from_spec(_spec)
sys.modules["speed_accuracy"] = accuracy
_spec.loader.exec_module(accuracy)

ROWS = accuracy.load_rows()


def test_the_table_holds_sourced_runs_of_several_publishers_gpus_and_methods():
    assert len(ROWS) >= 10 and len({r["id"] for r in ROWS}) == len(ROWS)
    assert len({r["source"] for r in ROWS}) >= 3
    assert {r["method"] for r in ROWS} >= {"full", "lora", "qlora"}
    assert len({r["gpu"] for r in ROWS}) >= 3
    for row in ROWS:
        assert row["source"].startswith("https://") and row["quote"], row["id"]
        assert ("measured" in row) != ("seconds" in row and "samples" in row), row["id"]
        assert flops.gpu_row(row["gpu"])[0] == row["gpu"], row["id"]
        assert ("arch" in row) != ("model" in row) and ("arch" in row or catalog.lookup(row["model"]) is not None), row[
            "id"
        ]


def test_predictions_stay_within_the_reported_error():
    results = accuracy.errors(ROWS)
    median, worst = accuracy.summary(results)
    assert median < 0.25 and worst < 0.5, [(r["id"], f"{e:+.0%}") for r, _, e in results]
    # Neither always high nor always low: the efficiency is fitted, not a bound.
    assert any(e > 0 for _, _, e in results) and any(e < 0 for _, _, e in results)
