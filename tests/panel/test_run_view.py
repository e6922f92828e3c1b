"""The run view's timer handler: full draw on change, (almost) nothing when nothing changed."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time

import gradio as gr
import pytest

from tunedeck.app.charts import BEFORE_COLOR
from tunedeck.app.live_progress import run_progress
from tunedeck.app.registry import Registry
from tunedeck.app.run_index import TABLE_HEADERS
from tunedeck.app.run_view import RunShown, RunView
from tunedeck.app.section import Page
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.supervisor import process_identity, update_status, write_status

RUN_ID = "20250101-120000-a1b2c3"


def finished_run(runs_dir):
    run_dir = runs_dir / RUN_ID
    (run_dir / "logs").mkdir(parents=True)
    now = time.time()
    write_status(
        run_dir,
        {
            "run_id": RUN_ID,
            "state": "finished",
            "title": "demo/model · lora · ddp · 2xCPU",
            "created_at": now - 60,
            "started_at": now - 50,
            "ended_at": now - 10,
            "exit_code": 0,
            "error": None,
        },
    )
    (run_dir / "job.yaml").write_text("method: lora\n")
    with open(run_dir / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"event": "start", "world_size": 2, "distributed_type": "MULTI_GPU", "max_steps": 3}) + "\n")
        for step in (1, 2, 3):
            f.write(
                json.dumps({"event": "log", "step": step, "max_steps": 3, "loss": 3.0 / step, "time": now - 40 + step})
                + "\n"
            )
    (run_dir / "logs" / "rank0.log").write_text("training...\n")
    return run_dir


class Drawn:
    """A built RunView and its registry; render() returns the redraw by id ("status"), plus "shown"."""

    def __init__(self, manager: RunManager):
        self.view, self.ui = RunView(manager), Registry()
        with gr.Blocks():
            self.view.build(Page(self.ui))

    def render(self, shown: RunShown, log_scale: bool = False, overlay: str | None = None) -> dict:
        out = self.view.render(shown, 0.6, log_scale, overlay)
        return {
            **{k.removeprefix("run."): v for k, v in self.ui.by_id(out).items()},
            "shown": out.get(self.view.shown, shown),
        }


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    finished_run(tmp_path)
    return Drawn(RunManager(tmp_path))


def test_first_tick_draws_everything_then_idle_ticks_skip(run):
    first = run.render(RunShown())
    assert first["shown"].run == RUN_ID  # follows the newest run when none is live
    assert "finished" in first["status"] and "2 ranks · DDP" in first["facts"]
    assert [t.name for t in first["loss_chart"].data][:1] == ["this run loss"]
    assert run.render(first["shown"]) == {"shown": first["shown"]}  # nothing new: nothing sent

    # One new line in metrics.jsonl: the charts are redrawn, the run list is not.
    with open(run.view.manager.run_dir(RUN_ID) / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "log", "step": 4, "loss": 0.5}) + "\n")
    third = run.render(first["shown"])
    assert "loss_chart" in third and "table" not in third
    assert len(third["loss_chart"].data[0].x) == 4


def test_changing_a_chart_option_redraws(run):
    first = run.render(RunShown())
    assert run.render(first["shown"], log_scale=True)["loss_chart"].layout.yaxis.type == "log"


def test_an_overlaid_run_says_what_it_did_differently(run, tmp_path):
    from tunedeck.backend.spec import resolve_spec, set_paths, spec_to_yaml

    other = "20250101-130000-d4e5f6"
    shutil.copytree(tmp_path / RUN_ID, tmp_path / other)
    demo = resolve_spec("demo")
    (tmp_path / RUN_ID / "job.yaml").write_text(spec_to_yaml(demo))
    changed = set_paths(demo, {"training.learning_rate": 0.001, "lora.r": 8, "quantization.bnb_4bit_quant_type": "fp4"})
    (tmp_path / other / "job.yaml").write_text(spec_to_yaml(changed))
    shown = RunShown(run=RUN_ID, follow=False)
    first = run.render(shown, overlay=other)
    # The 4-bit type applies to neither run (no quantization): not a difference that matters.
    assert (
        first["compared"]
        == f"**Overlaid run `{other}`** (this run's value → its own): lora.r 16 → 8 · training.learning_rate 0.005 → 0.001"
    )
    assert [t.name for t in first["loss_chart"].data if t.name.endswith(" loss")] == ["this run loss", f"{other} loss"]
    assert "compared" not in run.render(first["shown"], overlay=other)  # nothing changed: not sent again
    assert run.render(first["shown"])["compared"] == ""


def test_a_bad_run_id_is_a_message(run):
    assert "is not a run id" in run.render(RunShown(run="../../etc", follow=False))["status"]


def test_the_runs_table_never_shows_a_live_runs_clock_frozen(run, tmp_path):
    # The table is redrawn on state changes only: a live run's duration would stay at its first value.
    live = "20250101-130000-d4e5f6"
    (tmp_path / live).mkdir()
    now = time.time()
    write_status(
        tmp_path / live,
        {
            "run_id": live,
            "state": "running",
            "title": "t",
            "created_at": now - 3600,
            "started_at": now - 3600,
            "ended_at": None,
            "exit_code": None,
            "error": None,
            "supervisor": process_identity(os.getpid()),
        },
    )  # alive: this test process
    rows = {row[0]: dict(zip(TABLE_HEADERS, row)) for row in run.render(RunShown())["table"]}
    assert rows[live]["state"] == "running" and rows[live]["duration"] == ""
    assert rows[RUN_ID]["duration"] == "0:40"  # an ended run: its real duration


def test_damaged_run_folders_are_one_row_each_and_break_nothing(run, tmp_path):
    # Newer than the good run: a reader that fails at the first bad folder never shows the good one.
    damaged = {
        "20250102-120000-00000a": "[1, 2]",
        "20250102-120000-00000b": '{"state": 5}',
        "20250102-120000-00000c": None,
    }
    for run_id, text in damaged.items():
        (tmp_path / run_id).mkdir()
        if text is not None:
            (tmp_path / run_id / "status.json").write_text(text)
    with open(tmp_path / RUN_ID / "metrics.jsonl", "a") as f:  # and one record of the wrong types in the good run
        f.write(json.dumps({"event": "log", "step": "four", "max_steps": [3], "loss": "high"}) + "\n")

    out = run.render(RunShown())
    assert out["shown"].run == RUN_ID and "finished" in out["status"]  # follows the newest run that can be shown
    assert "step 3/3" in out["progress"] and len(out["loss_chart"].data[0].x) == 3
    state = TABLE_HEADERS.index("state")
    assert {row[0]: row[state] for row in out["table"]} == {RUN_ID: "finished", **dict.fromkeys(damaged, "damaged")}

    picked = run.render(RunShown(run="20250102-120000-00000a", follow=False))
    assert "⚠ damaged" in picked["status"]
    assert picked["error"]["visible"] and "status.json holds a JSON list, not an object" in picked["error"]["value"]
    assert picked["stop"]["interactive"] is False


def test_hints_follow_the_state_and_resume_needs_a_checkpoint(run, tmp_path):
    run_dir = tmp_path / RUN_ID
    (run_dir / "notes.json").write_text('{"name": "baseline", "notes": "first try"}')
    first = run.render(RunShown())
    assert "**baseline**" in first["status"] and (first["name"], first["notes"]) == ("baseline", "first try")
    assert "final loss 1.0000 · best 1.0000 at step 3" in first["summary"]
    assert first["resume"]["interactive"] is False  # finished: nothing to resume

    update_status(run_dir, state="stopped")
    stopped = run.render(first["shown"])
    assert "no checkpoint was saved" in stopped["status"] and "resume" not in stopped  # still not interactive
    (run_dir / "output" / "checkpoint-3").mkdir(parents=True)
    update_status(run_dir, state="failed")  # a new state: the folder is looked at again
    failed = run.render(stopped["shown"])
    assert "Resume** continues from its checkpoint at step 3" in failed["status"]
    assert failed["resume"]["interactive"] is True and "stopping" not in failed["status"]
    assert "name" not in failed  # the boxes are the user's once filled: never overwritten by a redraw


def test_picking_the_run_already_shown_keeps_what_the_user_typed_in_its_boxes(run, tmp_path):
    (tmp_path / RUN_ID / "notes.json").write_text('{"name": "baseline", "notes": ""}')
    followed = run.render(RunShown())["shown"]  # the page follows the run: its boxes are filled
    # The user picks that same run and starts typing a name before the pick's answer arrives:
    # the answer must not put the saved name back over what they typed.
    again = run.render(followed.picked(RUN_ID))
    assert "status" in again and "name" not in again and "notes" not in again
    # Another run picked: its boxes are filled with that run's name and notes.
    shutil.copytree(tmp_path / RUN_ID, tmp_path / "20250102-120000-00000a")
    (tmp_path / "20250102-120000-00000a" / "notes.json").write_text('{"name": "second", "notes": "more"}')
    other = run.render(followed.picked("20250102-120000-00000a"))
    assert (other["name"], other["notes"]) == ("second", "more")
    assert RunShown().picked("").follow and RunShown().picked(None).run is None  # "(follow the live run)"


def test_before_the_first_step_the_loss_chart_says_so_instead_of_empty_axes(run, tmp_path):
    (tmp_path / RUN_ID / "metrics.jsonl").write_text("")
    out = run.render(RunShown())
    (note,) = out["loss_chart"].layout.annotations
    assert "No training step logged yet" in note.text and not out["loss_chart"].data
    assert out["metrics_chart"]["visible"] is False and out["summary"] == ""


def resumed(runs_dir, parent: str, run_id: str, from_step: int, steps: range) -> None:
    """A run that resumed `parent`'s output folder at its checkpoint `from_step` (as run_resume writes it)."""
    shutil.copytree(runs_dir / RUN_ID, runs_dir / run_id)
    job = {
        "method": "lora",
        "output_dir": str(runs_dir / parent / "output"),
        "training": {"resume_from_checkpoint": True},
    }
    (runs_dir / run_id / "job.yaml").write_text(json.dumps(job))  # JSON is YAML
    start = {"event": "start", "world_size": 2, "max_steps": 20, "resumed_from_step": from_step}
    logs = [{"event": "log", "step": step, "max_steps": 20, "loss": 1.0 / step} for step in steps]
    (runs_dir / run_id / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [start, *logs]))


def test_a_resumed_runs_chart_draws_the_loss_of_the_runs_it_continues_before_its_own(run, tmp_path):
    """Stopped at step 3 after a checkpoint at 2, resumed from 2 (steps 3-5), stopped, resumed again from 4: the
    newest run's chart draws its forebears' loss up to where each was taken over, lighter, then its own."""
    first, second, third = RUN_ID, "20250101-130000-00000b", "20250101-140000-00000c"
    resumed(tmp_path, first, second, 2, range(3, 6))
    resumed(tmp_path, first, third, 4, range(5, 8))  # a resume of the resume writes to the first's output too
    (tmp_path / "20250101-135000-00000d").mkdir()  # an unrelated, damaged folder between them: skipped
    out = run.render(RunShown(run=third, follow=False))
    traces = {t.name: t for t in out["loss_chart"].data}
    assert list(traces["before resume loss"].x) == [1, 2, 3, 4]  # the first's 1-2, the second's 3-4
    assert list(traces["this run loss"].x) == [5, 6, 7]
    assert traces["before resume smoothed"].line.color == BEFORE_COLOR != traces["this run loss"].line.color
    # The first run resumed nothing: its chart is its own alone.
    assert {t.name for t in run.render(RunShown(run=first, follow=False))["loss_chart"].data} == {
        "this run loss",
        "this run smoothed",
    }
    # Before its first step (no start record yet) a resumed run shows the loss it continues, not an empty chart.
    fourth = "20250101-150000-00000e"
    resumed(tmp_path, first, fourth, 6, range(0))
    (tmp_path / fourth / "metrics.jsonl").write_text("")
    out = run.render(RunShown(run=fourth, follow=False))
    assert [t.name for t in out["loss_chart"].data] == ["before resume loss", "before resume smoothed"]
    assert list(out["loss_chart"].data[0].x) == [1, 2, 3, 4, 5, 6, 7]  # the third's all: where it goes on is unsaid


def test_a_resumed_grpo_runs_chart_draws_the_reward_it_continues_before_its_own():
    from tunedeck.app.charts import loss_figure

    before = [{"step": step, "reward": 0.1 * step, "loss": 0.01} for step in (1, 2)]
    figure = loss_figure([("this run", [{"step": 3, "reward": 0.5, "loss": 0.0}])], before=before)
    names = [t.name for t in figure.data]
    assert names[:3] == ["before resume reward", "before resume reward smoothed", "before resume loss"]
    assert "this run reward" in names and figure.data[0].line.color == BEFORE_COLOR


def test_a_live_runs_tick_redraws_only_what_grew_and_its_bar_moves_with_its_stream(run, tmp_path, monkeypatch):
    """Drawing charts and the log is what costs the browser (and a CPU run) the most: each is redrawn only when
    its own data grew, the charts of a live run every few seconds (a chart option or an eval loss at once), and
    an output whose value did not change is not sent again. The bar of a live run names the run and moves with
    its stream between ticks (app/live_progress.py): the ticks draw it again only at a change of state."""
    run_dir = tmp_path / RUN_ID
    status = json.loads((run_dir / "status.json").read_text())
    write_status(run_dir, {**status, "state": "running", "ended_at": None, "exit_code": None,
                           "supervisor": process_identity(os.getpid())})  # fmt: skip
    first = run.render(RunShown())
    assert "running" in first["status"] and "loss_chart" in first  # a run newly shown: everything
    assert f"data-run='{RUN_ID}' data-live='1' data-state='running'" in first["progress"]
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "log", "step": 4, "max_steps": 6, "loss": 0.5}) + "\n")
    polled = run_progress(run.view.manager, run.view.watches, RUN_ID)  # what the stream sends, between ticks
    assert polled["run"] == RUN_ID and polled["live"] and polled["width"] == "66.7%" and polled["state"] == "running"
    assert polled["text"].startswith("step 4/6")
    soon = run.render(first["shown"])
    assert "So far:** latest loss 0.5000" in soon["summary"] and "progress" not in soon  # the stream moved the bar
    assert not {"status", "facts", "stop", "resume", "error"} & set(soon)  # the same values: not sent again
    assert "loss_chart" not in soon and "log" not in soon  # the charts wait; the log did not grow
    assert "loss_chart" in run.render(soon["shown"], log_scale=True)  # a chart option: at once
    monkeypatch.setattr("tunedeck.app.run_view.charts_every_s", lambda age_s: 0)
    later = run.render(soon["shown"])
    assert len(later["loss_chart"].data[0].x) == 4 and "log" not in later
    assert set(run.render(later["shown"])) == {"shown"}  # nothing new: nothing sent (the stream moves the clock)
    # A progress bar rewriting the log between logged steps redraws the log alone, never the charts.
    with open(run_dir / "logs" / "rank0.log", "a") as f:
        f.write("  5%|▌ | 4/6\r 67%|██████ | 4/6\n")
    bar = run.render(later["shown"])
    assert set(bar) == {"log", "shown"} and bar["log"]["value"].endswith(" 67%|██████ | 4/6")
    monkeypatch.undo()
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    with open(run_dir / "metrics.jsonl", "a") as f:  # an eval loss is what a reader waits for: drawn at once
        f.write(json.dumps({"event": "log", "step": 4, "max_steps": 6, "eval_loss": 0.7}) + "\n")
    evaluated = run.render(bar["shown"])
    assert "this run eval loss" in [t.name for t in evaluated["loss_chart"].data] and "progress" not in evaluated
    update_status(run_dir, state="finished", ended_at=time.time())
    ended = run.render(evaluated["shown"])
    assert "data-live='0' data-state='finished'" in ended["progress"] and "finished" in ended["status"]
    assert "stop" in ended and "facts" not in ended


def test_a_live_runs_charts_are_redrawn_less_often_as_the_run_grows_longer():
    from tunedeck.app.run_view import TICK_S, charts_every_s

    assert charts_every_s(0) < TICK_S and charts_every_s(60) < TICK_S  # each tick in the first minutes
    assert TICK_S < charts_every_s(300) < charts_every_s(480) < 30  # then less often
    assert charts_every_s(600) == charts_every_s(86_400) == 30  # every 30 s from the tenth minute, as TensorBoard


@pytest.mark.timeout(30)  # a stream that did not end would hang here
def test_the_progress_stream_sends_each_change_of_the_bar_and_ends_with_the_run(run, tmp_path, monkeypatch):
    """The page's stream of a live run's bar, through the panel's HTTP route: the bar at once, a new one when a
    record arrives, the final one when the run ends, and then the stream closes (the page opens no other)."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from tunedeck.app import live_progress

    monkeypatch.setattr(live_progress, "POLL_S", 0.05)
    run_dir = tmp_path / RUN_ID
    status = json.loads((run_dir / "status.json").read_text())
    write_status(run_dir, {**status, "state": "running", "ended_at": None, "exit_code": None,
                           "supervisor": process_identity(os.getpid())})  # fmt: skip
    app = Starlette(routes=[live_progress.progress_route(run.view.manager, run.view.watches)])
    bars = []
    with TestClient(app) as client, client.stream("GET", f"{live_progress.PATH}?run={RUN_ID}") as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            bars.append(json.loads(line.removeprefix("data: ")))
            if len(bars) == 1:
                with open(run_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps({"event": "log", "step": 5, "max_steps": 6, "loss": 0.4}) + "\n")
            elif bars[-1]["text"].startswith("step 5/6"):
                update_status(run_dir, state="finished", ended_at=time.time())
    texts = [bar["text"].split(" ·")[0] for bar in bars]
    assert texts[0] == "step 3/3" and "step 5/6" in texts, texts
    assert bars[-1]["state"] == "finished" and not bars[-1]["live"] and bars[-1]["color"] == "#16a34a"
    assert all(bar["live"] for bar in bars[:-1]) and all(a != b for a, b in itertools.pairwise(bars))  # changes only
    with TestClient(app) as client:
        assert client.get(f"{live_progress.PATH}?run=../../etc/passwd").status_code == 404


def test_the_run_box_says_a_run_ended_on_the_tick_its_state_line_does(run, tmp_path):
    """The runs list is shared and read again every 2 s; the shown run's own state is read every tick. When they
    disagree the list is read again, so the Run box never says ▶ under a state line that says finished."""
    run_dir = tmp_path / RUN_ID
    status = json.loads((run_dir / "status.json").read_text())
    write_status(run_dir, {**status, "state": "running", "ended_at": None, "exit_code": None,
                           "supervisor": process_identity(os.getpid())})  # fmt: skip
    live = run.render(RunShown())
    assert live["select"]["choices"][0][0].startswith("▶ ") and "running" in live["status"]
    update_status(run_dir, state="finished", ended_at=time.time(), exit_code=0)  # within the list's 2 s
    ended = run.render(live["shown"])
    assert "finished" in ended["status"] and ended["select"]["choices"][0][0].startswith("✓ "), ended["select"]
