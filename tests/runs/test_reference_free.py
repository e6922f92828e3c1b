"""ORPO and SimPO on the demo's preference pairs: 2 real ranks learn to prefer the chosen answers, with no reference.

The demo's pairs (backend/data/demo.py) put each question's answer (chosen) against the question restated
(rejected). Neither objective loads or scores a reference: the start record names none and the FLOPs count
no extra forward. The proof that the run learns from the pairs is Evaluate's share of held-out pairs whose
chosen answer the model prefers (summed log-probability), which rises from the base model's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import log_records, read_metrics, start_record
from .preset_proof import assert_proves
from .test_dpo import mean, train_preset

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 60  # the presets' own run, evaluated at its end
ROWS = 64  # held-out pairs Evaluate scores


def preferred_shares(runs_dir: Path, run_id: str, run_dir: Path) -> tuple[float, float]:
    """(base, final): the share of held-out pairs whose chosen answer each model prefers (`tunedeck eval`)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tunedeck"), "eval", run_id, "--runs-dir", str(runs_dir), "--limit",
         str(ROWS)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PREFERRED" in done.stdout and "validation" in done.stdout
    results = json.loads((run_dir / "eval.json").read_text())["results"]
    assert results["final"]["examples"] == ROWS
    print(f"{run_dir.name}: held-out chosen preferred {results['base']['preferred']:.3f} -> "
          f"{results['final']['preferred']:.3f}")  # fmt: skip
    return results["base"]["preferred"], results["final"]["preferred"]


@pytest.mark.parametrize("objective", ["orpo", "simpo"])
def test_demo_learns_to_prefer_the_chosen_answers_without_a_reference(objective, runs_dir):
    held_out = {"dataset.eval_split": "validation", "training.eval_steps": STEPS}
    run_id, run_dir = train_preset(runs_dir, f"demo-{objective}", held_out)
    start = start_record(run_dir)
    assert_proves(f"demo-{objective}", start)  # DDP, LoRA, the objective without a reference
    assert start["flops_inputs"]["extra_forwards"] == 0 and start["flops_inputs"]["sequences_per_row"] == 2

    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == list(range(1, STEPS + 1))
    last = logs[-10:]
    assert mean(r["reward_accuracy"] for r in last) >= 0.7
    assert mean(r["reward_margin"] for r in last) > mean(r["reward_margin"] for r in logs[:3])
    if objective == "orpo":  # its own terms: the chosen answers' NLL falls, the log odds ratio rises
        assert mean(r["nll_loss"] for r in last) < logs[0]["nll_loss"]
        assert mean(r["log_odds_ratio"] for r in last) > logs[0]["log_odds_ratio"]
    else:  # SimPO trains no NLL term (cpo_alpha 0): the record carries none
        assert not any("nll_loss" in r for r in logs)
    (evaluated,) = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_reward_accuracy" in r]
    assert evaluated["step"] == STEPS and evaluated["eval_reward_accuracy"] >= 0.7  # held-out pairs: chance is 0.5
    assert (run_dir / "output" / "adapter_model.safetensors").is_file()

    base, final = preferred_shares(runs_dir, run_id, run_dir)
    assert final >= 0.8 and final > base
