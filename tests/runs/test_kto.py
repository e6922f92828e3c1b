"""KTO on the demo's answers labelled good or bad: 2 real ranks learn from them, with no pairs.

Each row of the demo's unpaired data (backend/data/demo.py) holds one answer to a question: the answer (good)
or the question restated (bad), never both. The rewards KTOTrainer logs are the proof that the run learns
from the labels, not only that it runs: the good answers' reward rises above the reference, the bad
ones' falls below it, on the training rows and on held-out ones.
"""

from __future__ import annotations

import pytest

from .helpers import log_records, read_metrics, start_record
from .preset_proof import assert_proves
from .test_dpo import STEPS, mean, train_preset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_demo_kto_learns_good_answers_up_and_bad_answers_down(runs_dir):
    _, run_dir = train_preset(runs_dir, "demo-kto")
    start = start_record(run_dir)
    assert_proves("demo-kto", start)  # DDP, LoRA, KTO against the base with the adapters off
    assert start["flops_inputs"]["extra_forwards"] == 3  # the reference's forward and the KL answer's two

    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == list(range(1, STEPS + 1))
    # At step 1 the policy is its reference (LoRA starts as a no-op): every reward is 0 and each row's loss
    # is 1 - sigmoid(0) = 0.5. Then the good answers' reward rises and the bad ones' falls.
    assert logs[0]["reward_margin"] == 0 and logs[0]["loss"] == pytest.approx(0.5, abs=1e-4)
    last = logs[-10:]
    assert mean(r["loss"] for r in last) < 0.4
    assert mean(r["reward_chosen"] for r in last) > 0 > mean(r["reward_rejected"] for r in last)
    assert mean(r["reward_margin"] for r in last) > 1.0
    assert all(r["kl"] >= 0 and "reward_accuracy" not in r for r in logs)  # no pairs: nothing to win
    (evaluated,) = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_reward_margin" in r]
    assert evaluated["step"] == STEPS and evaluated["eval_reward_margin"] > 1.0  # held-out rows: 0 is no learning
    assert (run_dir / "output" / "adapter_model.safetensors").is_file()
