"""DPO on the demo's preference pairs: 2 real ranks learn to prefer the chosen answers.

The demo's pairs (backend/data/demo.py) put each question's answer (chosen) against the question
restated (rejected). The rewards DPOTrainer logs are the proof that the run learns from the
pairs, not only that it runs: the share of pairs where chosen wins climbs from chance, on the
training pairs and on held-out ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import log_records, read_metrics, start_record
from .preset_proof import assert_proves
from .test_training_runs import assert_finished, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 30


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def train_preset(runs_dir: Path, preset: str, changes: dict | None = None) -> tuple[str, Path]:
    """(run id, run folder) of a demo preset trained to its end on 2 ranks: by default STEPS steps, evaluated on
    held-out rows at the end; `changes` in place of that."""
    from tunedeck.backend.spec import resolve_spec, set_paths

    default = {"training.max_steps": STEPS, "dataset.eval_split": "validation", "training.eval_steps": STEPS}
    spec = set_paths(resolve_spec(preset), default if changes is None else changes)
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    return run_id, manager.run_dir(run_id)


def test_demo_dpo_learns_to_prefer_the_chosen_answers(runs_dir):
    run_id, run_dir = train_preset(runs_dir, "demo-dpo")
    start = start_record(run_dir)
    assert_proves("demo-dpo", start)  # DDP, LoRA, DPO against the base with the adapters off

    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == list(range(1, STEPS + 1))
    # At step 1 the policy is its reference (LoRA starts as a no-op): every reward is 0, no pair is won and
    # the loss is ln 2. Then chosen wins most pairs, by a growing margin.
    assert logs[0]["reward_margin"] == 0 and logs[0]["reward_accuracy"] == 0
    assert logs[0]["loss"] == pytest.approx(0.6931, abs=1e-3)
    last = logs[-10:]
    assert mean(r["loss"] for r in last) < 0.45
    assert mean(r["reward_accuracy"] for r in last) >= 0.7
    assert mean(r["reward_margin"] for r in last) > 1.0
    assert all(r["reward_chosen"] - r["reward_rejected"] == pytest.approx(r["reward_margin"], abs=1e-3) for r in logs)
    (evaluated,) = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_reward_accuracy" in r]
    assert evaluated["step"] == STEPS and evaluated["eval_reward_accuracy"] >= 0.7  # held-out pairs: chance is 0.5
    assert (run_dir / "output" / "adapter_model.safetensors").is_file()

    # Evaluate scores the chosen answers and how often each model prefers them (summed log-probability).
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tunedeck"), "eval", run_id, "--runs-dir", str(runs_dir), "--limit", "24"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PREFERRED" in done.stdout and "validation" in done.stdout
    results = json.loads((run_dir / "eval.json").read_text())["results"]
    assert results["final"]["examples"] == 24 and results["final"]["preferred"] >= 0.8
    assert results["final"]["preferred"] >= results["base"]["preferred"]
