"""What a person sees of a GRPO run: its reward first on the charts, its answers below the metrics, the reward's
change in the summary, the objective and its rewards in the facts, reward in each followed step, prompts and their
reference answers in the preview.

These tests write records as train.py writes them (its grpo_record turns TRL's GRPOTrainer logs into a log
record's keys); a real run's records, drawn and summed up, are in tests/runs/test_grpo.py, beside its learning test.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import plotly.graph_objects as go
import pytest
import yaml

from tunedeck.app.charts import (
    GRPO_KL_PANEL,
    GRPO_PANELS,
    METRIC_PANELS,
    PREFERENCE_PANELS,
    loss_figure,
    metrics_figure,
)
from tunedeck.app.data_upload import OBJECTIVE_SAID
from tunedeck.app.run_index import TABLE_HEADERS
from tunedeck.app.run_view import RunShown
from tunedeck.backend import recipe
from tunedeck.backend.cli.follow import ProgressBar, follow
from tunedeck.backend.recipe.objectives import objective_record
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, OBJECTIVE_FORMATS
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.records import parse_line
from tunedeck.backend.runs.summary import facts_line, report, summarize, verdict
from tunedeck.backend.runs.supervisor import write_status
from tunedeck.backend.spec import JobSpec, spec_to_yaml

from .test_run_view import Drawn

RUN_ID = "20250101-120000-9a9b9c"
START = {"event": "start", "world_size": 2, "distributed_type": "MULTI_CPU", "method": "lora",
         "model_class": "DistributedDataParallel", "objective": "grpo", "reference": None, "max_steps": 20}  # fmt: skip


def trl_logs(step: int, eval_: bool = False, kl: bool = False) -> dict:
    """What TRL's GRPOTrainer logs at a step (its names), the reward rising with the steps."""
    prefix = "eval_" if eval_ else ""
    exact, close = min(1.0, 0.05 * step), min(1.0, 0.35 + 0.05 * (step - 1))
    logs = {
        f"{prefix}reward": exact + close,
        f"{prefix}reward_std": 0.4,
        f"{prefix}completions/mean_length": 3.5,
        f"{prefix}completions/clipped_ratio": 0.1,
        f"{prefix}frac_reward_zero_std": 0.02 * step,
        f"{prefix}rewards/exact_answer/mean": exact,
        f"{prefix}rewards/exact_answer/std": 0.3,
        f"{prefix}rewards/close_answer/mean": close,
        f"{prefix}rewards/close_answer/std": 0.2,
        f"{prefix}loss": 0.001,
    }
    if kl:
        logs[f"{prefix}kl"] = 0.001 * step
    return logs


def log_record(step: int, eval_: bool = False, kl: bool = False) -> dict:
    """A log record as train.py's on_log writes it for a GRPO run (through the readers' parsing)."""
    logs = trl_logs(step, eval_, kl)
    record = {"event": "log", "time": 1000.0 + step, "step": step, "max_steps": 20}
    if eval_:
        record["eval_loss"] = logs["eval_loss"]
    else:
        record.update(loss=logs["loss"], learning_rate=1e-3, grad_norm=0.5, tokens_per_second=5000.0)
    record.update(objective_record("grpo", logs))  # its row's keys (backend/recipe/objectives_table.py)
    record.update(recipe.grpo_record(logs))  # each reward's mean
    if kl:
        record[f"{'eval_' if eval_ else ''}kl"] = logs[f"{'eval_' if eval_ else ''}kl"]
    parsed = parse_line(json.dumps(record))
    assert parsed == record, "the contract (run_folder.LogRecord) must keep every key train.py writes"
    return parsed


def grpo_records(kl: bool = False) -> list[dict]:
    return [log_record(step, kl=kl) for step in (1, 5, 10, 15, 20)] + [log_record(20, eval_=True, kl=kl)]


def grpo_job(beta: float = 0.0) -> JobSpec:
    """The demo GRPO job as its run folder's job.yaml reads back (backend/runs/job_file.py)."""
    from tunedeck.backend.render import render_bundle
    from tunedeck.backend.spec import parse_spec, resolve_spec, set_paths

    spec = set_paths(resolve_spec("demo-grpo"), {"grpo.beta": beta})
    return parse_spec(yaml.safe_load(render_bundle(spec)["job.yaml"]))


def test_the_reward_chart_comes_first_with_a_line_per_reward_and_the_loss_below_it():
    records = grpo_records()
    fig = loss_figure([("this run", records)], smoothing=0.6)
    go.Figure(fig.to_plotly_json())  # what charts.py builds unvalidated must pass Plotly's validation
    assert fig.layout.title.text.startswith("Reward (")
    names = [trace.name for trace in fig.data]
    assert names[:2] == ["this run reward", "this run reward smoothed"]
    assert {"exact_answer", "close_answer", "eval exact_answer", "this run eval reward"} <= set(names)
    reward = next(t for t in fig.data if t.name == "this run reward")
    assert list(reward.y) == [r["reward"] for r in records if "reward" in r] and reward.yaxis == "y"
    exact = next(t for t in fig.data if t.name == "exact_answer")
    assert list(exact.y) == [r["rewards"]["exact_answer"] for r in records if "rewards" in r]
    loss = next(t for t in fig.data if t.name == "this run loss")
    assert loss.yaxis == "y2"  # below the reward, titled so that nobody reads GRPO's loss as its progress
    assert any("Loss (near 0 in GRPO" in a.text for a in fig.layout.annotations)
    # An overlaid run adds its reward and its loss, not its rewards' lines.
    both = loss_figure([("this run", records), ("other", grpo_records()[:2])], smoothing=0.0, log_scale=True)
    go.Figure(both.to_plotly_json())
    assert [t.name for t in both.data].count("exact_answer") == 1 and "other reward" in [t.name for t in both.data]


def test_the_answers_chart_is_below_the_metrics_with_shares_in_percent_and_kl_only_with_a_reference():
    fig = metrics_figure(grpo_records())
    go.Figure(fig.to_plotly_json())
    titles = [a.text for a in fig.layout.annotations]
    assert all(title in titles for _, title in GRPO_PANELS) and GRPO_KL_PANEL[1] not in titles
    assert not any(title in titles for panels in PREFERENCE_PANELS.values() for _, title in panels)
    names = {trace.name for trace in fig.data}
    assert {"completion length", "completions clipped", "groups without signal", "reward std"} <= names
    assert {"eval completion length", "eval groups without signal"} <= names
    shares = next(i for i, (keys, _) in enumerate(GRPO_PANELS) if "groups_without_signal" in keys)
    assert fig.layout[f"yaxis{len(METRIC_PANELS) + 1 + shares}"].tickformat == ".0%"
    with_kl = metrics_figure(grpo_records(kl=True))  # grpo.beta > 0: the KL to the reference, not KTO's panels
    go.Figure(with_kl.to_plotly_json())
    assert GRPO_KL_PANEL[1] in [a.text for a in with_kl.layout.annotations]
    assert {"kl", "eval kl"} <= {trace.name for trace in with_kl.data}
    # An SFT run's charts are as they were.
    sft = [{"step": s, "loss": 1.0 / s, "learning_rate": 1e-3} for s in (1, 2, 3)]
    assert loss_figure([("this run", sft)]).layout.title.text == "Loss"
    assert not any(title in [a.text for a in metrics_figure(sft).layout.annotations] for _, title in GRPO_PANELS)


def test_the_summary_says_the_reward_change_and_the_facts_the_objective_rewards_and_reference():
    run = read_records_of(grpo_records())
    line = report(run, started_at=100.0, ended_at=160.0).line()
    assert line.startswith("reward 0.400 → 2.000 · eval reward 2.000 · final loss 0.0010")
    assert "best" not in line  # GRPO's loss stays near 0: its lowest says nothing
    facts = summarize(run, 100.0, 160.0, job=grpo_job()).facts
    assert facts.endswith("· GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)")
    assert facts_line(START).endswith("· GRPO · reference: none (grpo.beta 0)")  # no job.yaml: no rewards named
    with_reference = {**START, "reference": "adapters off"}
    assert facts_line(with_reference, grpo_job(0.04)).endswith(
        "GRPO, rewards: exact_answer, close_answer · reference: adapters off (grpo.beta 0.04)"
    )
    from tunedeck.backend.spec import set_paths

    custom = set_paths(grpo_job(), {"grpo.rewards": ["exact_answer", "/home/me/rewards.py:score"]})
    assert "GRPO, rewards: exact_answer, rewards.py:score ·" in facts_line(START, custom)
    run.end = {"event": "end", "status": "finished"}
    assert verdict(run).line.endswith("loss 0.001 -> 0.001, reward 0.400 -> 2.000 over 5 steps")


def read_records_of(records: list[dict]):
    from tunedeck.backend.runs.records import RunRecords

    run = RunRecords()
    run.add([dict(START), *records])
    return run


def test_following_a_grpo_run_prints_its_reward_in_each_step():
    stream = io.StringIO()
    bar, run = ProgressBar(stream), read_records_of([])
    for record in grpo_records():
        run.add([record])
        bar.update(record, summarize(run, 900.0, None, now=record["time"]))
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("· loss 0.0010 · reward 0.400 · 2% of prompts scored alike")
    assert lines[-2].endswith("· reward 2.000 · 40% of prompts scored alike")
    assert lines[-1] == "step 20/20  eval_loss 0.0010 · reward 2.000 · 40% of prompts scored alike"


def grpo_run_folder(runs_dir: Path, records: list[dict], job) -> None:
    run_dir = runs_dir / RUN_ID
    (run_dir / "logs").mkdir(parents=True)
    now = time.time()
    write_status(run_dir, {"run_id": RUN_ID, "state": "finished", "title": "demo/model-sft · lora grpo · ddp · 2xCPU",
                           "created_at": now - 60, "started_at": now - 50, "ended_at": now - 10, "exit_code": 0,
                           "error": None})  # fmt: skip
    (run_dir / "job.yaml").write_text(spec_to_yaml(job))
    lines = [START, *records, {"event": "end", "status": "finished", "runtime_s": 40.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run_dir / "logs" / "rank0.log").write_text("training...\n")


def test_the_run_tab_shows_the_reward_chart_first_and_the_reward_in_its_summary(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    grpo_run_folder(tmp_path, grpo_records(), grpo_job())
    phases = [("importing the libraries", 100.0), ("joining the other processes", 108.2), ("loading the model", 108.4),
              ("building the trainer", 108.6), ("the first step", 109.9), ("training", 110.5)]  # fmt: skip
    (tmp_path / RUN_ID / recipe.STARTUP_FILE).write_text(
        json.dumps({"phases": [{"phase": p, "at": t} for p, t in phases]})
    )
    drawn = Drawn(RunManager(tmp_path)).render(RunShown())
    assert "GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)" in drawn["facts"]
    assert drawn["summary"].startswith("**Summary:** reward 0.400 → 2.000")
    # The time before step 1, naming the phases that took a second or more.
    assert drawn["summary"].endswith(
        " · **before step 1:** 0:10 (importing the libraries 0:08, building the trainer 0:01, the rest under 1 s)"
    )
    assert drawn["loss_chart"].layout.title.text.startswith("Reward (")
    assert [t.name for t in drawn["loss_chart"].data][:1] == ["this run reward"]
    assert GRPO_PANELS[0][1] in [a.text for a in drawn["metrics_chart"]["value"].layout.annotations]
    (row,) = drawn["table"]
    assert row[TABLE_HEADERS.index("loss")] == "reward 2.000"  # its measure, not a loss near 0


def test_the_run_tab_shows_what_the_model_writes_best_first_with_its_rewards(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    grpo_run_folder(tmp_path, grpo_records(), grpo_job())
    drawn = Drawn(RunManager(tmp_path))
    assert drawn.render(RunShown())["answers"] == ""  # none written yet (and never for SFT, DPO or KTO)
    # GRPOTrainer's last generation batch as train.py reads it: 3 answers to each of 3 prompts, in order.
    prompts = ["Q: 1 + 1\nA:"] * 3 + ["Q: 2 + 2\nA:"] * 3 + ["Q: 3 + 3\nA:"] * 3
    answers = [" 2", " 3", " 2", " 4", " 4", " | 4", " 6", " 6", " 6"]
    exact = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    latest = {"prompt": prompts, "completion": answers, "rewards": {"exact_answer": exact},
              "advantages": [0.7, -1.4, 0.7, 0.7, 0.7, -1.4, 0.0, 0.0, 0.0]}  # fmt: skip
    recipe.write_answers(tmp_path / RUN_ID, 5, latest)
    shown = drawn.render(RunShown())["answers"]
    assert shown.startswith("#### What the model writes (step 5)")
    assert "Q: 3 + 3" not in shown  # two prompts a step
    table = [line for line in shown.splitlines() if line.startswith("| ")]
    assert table[:3] == [
        "| answer | written | exact_answer | advantage |",
        "| 2 | ×2 | 1.00 | +0.70 |",  # the same answer written twice: counted, best first
        "| 3 | ×1 | 0.00 | -1.40 |",
    ]
    assert r"| \| 4 | ×1 | 0.00 | -1.40 |" in table  # a pipe in an answer cannot break the table


def test_runs_show_list_and_follow_say_the_objective_and_the_reward(tmp_path, capsys):
    from tunedeck.__main__ import main

    grpo_run_folder(tmp_path, grpo_records(), grpo_job())
    assert main(["runs", "show", RUN_ID, "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "· GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)" in out
    assert "summary  reward 0.400 → 2.000 · eval reward 2.000 · final loss 0.0010" in out
    assert main(["runs", "--runs-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[5] == "LOSS" and listed[1].split()[5:7] == ["reward", "2.000"]
    # `tunedeck runs follow` (and `tunedeck train`): the facts with the rewards, then each step with its reward.
    assert follow(RunManager(tmp_path), RUN_ID).state == "finished"
    followed = capsys.readouterr().out.splitlines()
    assert followed[0].endswith("· GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)")
    assert followed[-2].endswith("· loss 0.0010 · reward 2.000 · 40% of prompts scored alike")


def test_uploaded_prompts_say_what_grpo_does_with_them_and_the_bundle_names_grpos_trainer():
    from tunedeck.backend.render import render_bundle
    from tunedeck.backend.spec import resolve_spec

    # An upload switches to the first objective that reads its format (backend/data/uploads.py): each is said.
    switched_to = {next(o for o, formats in OBJECTIVE_FORMATS.items() if f in formats) for f in DATASET_FORMATS}
    assert set(OBJECTIVE_SAID) == switched_to
    assert "GRPO" in OBJECTIVE_SAID["grpo"] and "`answer`" in OBJECTIVE_SAID["grpo"]
    readme = render_bundle(resolve_spec("demo-grpo"))["README.md"]
    assert "- `train_sft.py`: the training script (TRL GRPOTrainer: the job's objective is grpo)" in readme
    assert "- `training_args.yaml`: TRL GRPOConfig keyword arguments" in readme and readme.startswith("# lora GRPO")
    sft = render_bundle(resolve_spec("7b-lora-ddp"))["README.md"]
    assert "(TRL SFTTrainer: the job's objective is sft)" in sft and "SFTConfig keyword" in sft


@pytest.mark.slow  # datasets and transformers in a subprocess-free preview: over 5 s of imports
def test_the_preview_lists_prompts_as_the_model_reads_them_and_their_reference_answers(demo_home, tmp_path):
    from tunedeck.backend.cli.preview import stats_line
    from tunedeck.backend.data.preview import measured_seq_len, preview
    from tunedeck.backend.spec import resolve_spec, set_paths

    spec = resolve_spec("demo-grpo")
    result = preview(spec, rows=3)
    rows = [json.loads(line) for line in (demo_home / "prompts" / "train.jsonl").read_text().splitlines()[:3]]
    assert result["rows"] == [
        f"prompt (the model writes its answers after it):\n{r['prompt']}\n\n→ reference answer: {r['answer']}"
        for r in rows
    ]
    stats = result["stats"]
    assert stats["max_seq_length"] == spec.grpo.max_prompt_length and stats["limit_field"] == "grpo.max_prompt_length"
    assert result["packing"] is False and measured_seq_len(stats, False) is None
    said = stats_line(result)
    assert said.startswith(f"{stats['rows']:,} of {result['rows_in_split']:,} prompts measured, tokens: p50 ")
    assert "the answers are written by the model, 8 per prompt, up to grpo.max_completion_length " in said
    # The page's preview says the same: prompts against their own limit, no padding or packing (nor its estimate).
    from tunedeck.app.dataset_preview import preview_markdown

    page = preview_markdown(result)
    assert "prompts measured" in page and "| grpo.max_prompt_length | 64 (0 prompts longer: left out) |" in page
    assert "writes **8 answers** to each prompt, up to 12 tokens each" in page and "Prompt 3:" in page
    assert "packing" not in page.lower() and "max_seq_length" not in page
    # Chat prompts go through the chat template with the assistant's turn opened, as GRPOTrainer writes after it.
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        json.dumps({"prompt": [{"role": "user", "content": "Add 2 and 2."}], "answer": "4"}) + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": "Add 1 and 2."}]}) + "\n"
    )  # fmt: skip
    shown = preview(set_paths(spec, {"dataset.path": str(chat)}), rows=2)["rows"]
    assert (
        shown[0]
        == "prompt (the model writes its answers after it):\n<|user|>\nAdd 2 and 2.</s>\n<|assistant|>\n\n\n→ reference answer: 4"
    )
    assert shown[1].endswith("→ reference answer: none (only your own rewards can score this prompt)")
