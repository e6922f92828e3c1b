"""GRPO on the demo: 2 real ranks write answers to the demo's questions, rewards score them, and it learns.

The Demo GRPO preset starts from the demo model after a short supervised warm-up (backend/data/demo.py's model-sft:
about 1 answer in 5 right), writes 8 answers to each of 8 questions a step (64 across the 2 ranks), and scores
each with exact_answer (1 for the reference answer) and close_answer (partial credit). The rewards TRL logs are
the proof that the run learns from them, not only that it runs: they rise, and more and more of a question's
answers agree (the model grows sure of them). The same run is then read as a person sees it (its reward drawn
first, its change said in the summary and `tunedeck runs show`) and evaluated on its held-out prompts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import yaml

from tunedeck.app.charts import loss_figure, metrics_figure
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.records import read_records
from tunedeck.backend.runs.status import from_status_file
from tunedeck.backend.runs.summary import report

from .helpers import log_records, logs_tail, read_metrics, start_record
from .preset_proof import assert_proves
from .test_dpo import mean, train_preset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


HELD_OUT = "validation[:32]"  # 32 held-out questions of the demo's prompts, 8 answers each, at the end


@pytest.fixture(scope="module")
def learned(tmp_path_factory, demo_home) -> tuple[str, Path]:
    """(run id, run folder) of the demo-grpo preset trained to its end (150 steps) on 2 ranks, evaluated at the end."""
    held_out = {"dataset.eval_split": HELD_OUT, "training.eval_steps": 150, "training.per_device_eval_batch_size": 8}
    return train_preset(tmp_path_factory.mktemp("grpo-runs"), "demo-grpo", held_out)


def test_demo_grpo_learns_from_its_rewards(learned):
    _, run_dir = learned
    start = start_record(run_dir)
    assert_proves("demo-grpo", start)  # DDP, LoRA, GRPO without a reference
    assert start["flops_inputs"]["extra_forwards"] == 1  # writing the answers: a forward a token, no reference

    logs = log_records(run_dir)
    limit = yaml.safe_load((run_dir / "job.yaml").read_text())["grpo"]["max_completion_length"]
    assert limit == 12  # the bound below means something only while the answers are this short: a long limit
    # would make "at most half of it" hold for any answer
    assert [r["step"] for r in logs] == [1, *range(5, 151, 5)]
    for record in logs:
        assert set(record["rewards"]) == {"exact_answer", "close_answer"}
        assert record["reward"] == pytest.approx(sum(record["rewards"].values()), abs=1e-4)
        assert 0 <= record["rewards"]["exact_answer"] <= record["rewards"]["close_answer"] <= 1
        # The warmed-up model ends its answers itself (EOS), a few tokens long: more than the EOS alone (an empty
        # answer is 1 token), at most half of max_completion_length on average, and under 10% of them cut at it.
        # A model that rambled would fill the 12 tokens and be cut; one that wrote nothing would stay at 1.
        assert 1 < record["completion_length"] <= limit / 2, record
        assert record["completions_clipped"] < 0.1, record
    first, last = logs[1:11], logs[-10:]  # steps 5-50 and 105-150 (step 1 alone is 8 questions)
    assert mean(r["reward"] for r in last) > mean(r["reward"] for r in first)
    assert mean(r["rewards"]["exact_answer"] for r in last) > mean(r["rewards"]["exact_answer"] for r in first)
    # A question whose 8 answers all score the same teaches nothing more: the sure ones pile up as it learns.
    assert mean(r["groups_without_signal"] for r in last) > mean(r["groups_without_signal"] for r in first)
    (evaluated,) = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_reward" in r]
    assert evaluated["step"] == 150 and evaluated["eval_reward"] > 0
    assert set(evaluated["eval_rewards"]) == {"exact_answer", "close_answer"}
    assert (run_dir / "output" / "adapter_model.safetensors").is_file()
    # Writing answers is progress the stall watch sees: rank 0 counts the forward passes, a token each.
    assert json.loads((run_dir / "progress.json").read_text())["forwards"] > 150 * 3
    # What the model wrote, scored: two questions at each logging step, all 8 answers of each.
    answers = [json.loads(line) for line in (run_dir / "answers.jsonl").read_text().splitlines()]
    assert [a["step"] for a in answers] == [r["step"] for r in logs]
    for group in answers[-1]["groups"]:
        assert group["prompt"].startswith("Q: ") and len(group["answers"]) == 8
        for answer in group["answers"]:
            assert set(answer["rewards"]) == {"exact_answer", "close_answer"} and answer["advantage"] is not None


def test_the_learned_runs_records_draw_its_reward_and_say_its_change(learned, capsys):
    from tunedeck.__main__ import main

    run_id, run_dir = learned
    run = read_records(run_dir)
    assert run.start["objective"] == "grpo" and run.start["reference"] is None
    logged = [r for r in run.records if "loss" in r]
    assert all(
        {"reward", "reward_std", "rewards", "completion_length", "groups_without_signal"} <= set(r) for r in logged
    )
    assert set(logged[0]["rewards"]) == {"exact_answer", "close_answer"}
    fig = loss_figure([("this run", run.records)])
    go.Figure(fig.to_plotly_json())
    assert {"this run reward", "exact_answer", "close_answer"} <= {t.name for t in fig.data}
    metrics = metrics_figure(run.records)
    go.Figure(metrics.to_plotly_json())
    assert {"completion length", "completions clipped", "groups without signal"} <= {t.name for t in metrics.data}
    first, last = logged[0]["reward"], logged[-1]["reward"]
    evaluated = next(r["eval_reward"] for r in run.records if "eval_reward" in r)
    line = report(run, 0.0, 1.0).line()
    assert line.startswith(f"reward {first:.3f} → {last:.3f} · eval reward {evaluated:.3f} · final loss "), line
    assert main(["runs", "show", run_id, "--runs-dir", str(run_dir.parent)]) == 0
    out = capsys.readouterr().out
    assert "· lora · DistributedDataParallel · GRPO, rewards: exact_answer, close_answer · reference: none" in out
    assert f"summary  reward {first:.3f} → {last:.3f}" in out


def test_the_learned_run_is_evaluated_on_its_held_out_prompts_against_their_reference_answers(learned, demo_home):
    from tunedeck.backend.after.evaluate import evaluate_run

    run_id, run_dir = learned
    prompts = demo_home / "prompts"
    got = evaluate_run(run_dir, RunManager(run_dir.parent).job(run_id), ["final"], "cpu", limit=16)
    assert got["data"] == f"{prompts} [{HELD_OUT}]"  # the split it was evaluated on while it trained
    final = got["results"]["final"]
    rows = [json.loads(line) for line in (prompts / "validation.jsonl").read_text().splitlines()[:16]]
    assert final["generated"] == 16 and final["exact_match"] is not None and final["loss"] is not None
    assert [(a["prompt"], a["expected"]) for a in final["answers"]] == [(r["prompt"], r["answer"]) for r in rows]


def test_your_own_reward_function_scores_the_answers_and_one_that_scores_none_is_a_warning(tmp_path):
    from .test_smoke_presets import smoke

    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "def brevity(completions, answer, **columns):\n"
        "    # TRL passes the rows' other columns by name: the reference answer here\n"
        "    return [1.0 / (1 + len(c.split())) for c in completions]\n"
        "def abstains(completions, **columns):\n"
        "    return [None for _ in completions]  # applies to no row (TRL leaves None out)\n",
        encoding="utf-8",
    )
    mine = f"'{rewards}:brevity', '{rewards}:abstains'"
    _, run_dir = smoke("demo-grpo", tmp_path, f"grpo.rewards=[exact_answer, {mine}]")
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == [1, 2, 3]
    assert all(set(r["rewards"]) == {"exact_answer", "brevity", "abstains"} for r in logs)
    assert all(0 < r["rewards"]["brevity"] <= 1 and r["rewards"]["abstains"] is None for r in logs)
    # It scored no answer of any step: the run says so in its state line (status.json) and rank 0's log.
    warning = "the reward abstains (grpo.rewards[2]) scored none of the 4 answers at step 3 (None for each)"
    status = from_status_file(run_dir.name, json.loads((run_dir / "status.json").read_text()))
    assert status.where.startswith(f"⚠ {warning}"), status.where
    assert f"warning: {warning}" in (run_dir / "logs" / "rank0.log").read_text()


def test_a_reward_module_that_hangs_at_import_stalls_the_run_and_stop_when_stalled_ends_it(runs_dir, tmp_path):
    from tunedeck.backend.spec import resolve_spec, set_paths

    hangs = tmp_path / "hangs.py"
    hangs.write_text(
        "import time\ntime.sleep(600)\ndef score(completions, **_):\n    return [0.0] * len(completions)\n"
    )
    changes = {"grpo.rewards": [f"{hangs}:score"], "launch.stall_minutes": 0.05, "launch.stop_when_stalled": True}
    manager = RunManager(runs_dir)
    run_id = manager.start(set_paths(resolve_spec("demo-grpo"), changes))  # 3 s
    status = manager.wait(run_id, timeout=300)
    run_dir = manager.run_dir(run_id)
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    assert re.search(
        r"stalled: importing the reward functions for 0 min \(launch\.stall_minutes, launch\.stop_when_stalled\); "
        "each rank's stack is in its log",
        status.error,
    ), status.error
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "tunedeck: stalled: importing the reward functions for 0 min on rank 0" in log and "hangs.py" in log
    assert not (run_dir / "metrics.jsonl").exists()  # the model never loaded: the import comes first


def test_reward_weights_make_the_reward_a_weighted_sum(runs_dir):
    # close_answer weighs nothing: the reward GRPO learns from is exact_answer's alone
    changes = {"training.max_steps": 3, "training.logging_steps": 1, "grpo.reward_weights": [1, 0]}
    _, run_dir = train_preset(runs_dir, "demo-grpo", changes)
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == [1, 2, 3]
    for r in logs:
        assert r["reward"] == pytest.approx(r["rewards"]["exact_answer"], abs=1e-6), r
    assert any(r["rewards"]["close_answer"] > r["rewards"]["exact_answer"] for r in logs)  # the weight mattered
