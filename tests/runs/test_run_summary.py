"""One run summary (backend/runs/summary.py) in every front end: `tunedeck runs`, `runs show`, train's progress line, the panel."""

from __future__ import annotations

import io
import json
import re
import time

from tunedeck.app.run_watch import RunWatch
from tunedeck.backend.cli.follow import ProgressBar
from tunedeck.backend.runs.records import RunRecords, parse_record, read_records
from tunedeck.backend.runs.summary import summarize, verdict

from .helpers import fake_run, tunedeck

RUN_ID = "20250101-120000-00000c"
START = {"event": "start", "world_size": 2, "nodes": ["n0", "n1"], "distributed_type": "MULTI_CPU", "method": "lora",
         "model_class": "DistributedDataParallel", "trainable_params": 10, "total_params": 40, "max_steps": 3}  # fmt: skip
FACTS = (
    "2 ranks on 2 machines (n0, n1) · DDP · 25.0% of parameters trainable (10 of 40) · lora · DistributedDataParallel"
)


def finished_run(runs_dir):
    folder = fake_run(runs_dir, RUN_ID, "finished", None)
    status = json.loads((folder / "status.json").read_text())
    status.update(ended_at=status["started_at"] + 40, exit_code=0)
    (folder / "status.json").write_text(json.dumps(status))
    logs = [
        {"event": "log", "step": s, "max_steps": 3, "loss": 3.0 / s, "time": time.time() - 40 + s} for s in (1, 2, 3)
    ]
    logs.insert(2, {"event": "log", "step": 2, "max_steps": 3, "eval_loss": 2.5, "time": time.time() - 37})
    end = {"event": "end", "status": "finished", "error": None}
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [START, *logs, end]))
    return folder


def test_the_cli_and_the_panel_say_the_same_about_a_run(runs_dir):
    folder = finished_run(runs_dir)
    show = tunedeck("runs", "show", RUN_ID, "--runs-dir", runs_dir)
    assert show.returncode == 0, show.stderr
    assert f"got      {FACTS}\n" in show.stdout
    assert "progress step 3/3, loss 1.0000\n" in show.stdout  # the last training loss, not the eval loss after it
    listing = tunedeck("runs", "--runs-dir", runs_dir)
    (row,) = [line.split() for line in listing.stdout.splitlines() if line.startswith(RUN_ID)]
    assert row[1:6] == ["-", "finished", "local", "3/3", "1.0000"]  # no name yet

    watch = RunWatch(folder)  # the panel's reader of the same folder
    watch.refresh()
    panel = summarize(watch, started_at=100.0, ended_at=140.0)
    assert panel.facts == FACTS and panel.progress == "step 3/3 · elapsed 0:40"


def test_train_progress_line_is_the_summarys_progress_with_the_loss():
    out, run = io.StringIO(), RunRecords()
    bar = ProgressBar(out)

    def feed(records: list[dict]) -> None:
        for raw in records:
            record = parse_record(raw)
            run.add([record])
            bar.update(record, summarize(run, started_at=100.0, ended_at=None, now=record["time"]))

    feed(
        [
            {"event": "log", "step": 1, "max_steps": 4, "loss": 2.0, "time": 110.0},
            {"event": "log", "step": 2, "max_steps": 4, "loss": 1.5, "time": 120.0, "seconds_per_step": 10.0},
            {"event": "log", "step": 2, "max_steps": 4, "eval_loss": 1.25, "time": 125.0, "seconds_per_step": 15.0},
        ]
    )
    assert out.getvalue().splitlines() == [
        "[######..................] step 1/4 · elapsed 0:10 · loss 2.0000",
        "[############............] step 2/4 · elapsed 0:20 · ETA 0:20 · loss 1.5000",  # 10 s a step, 2 to go
        "step 2/4  eval_loss 1.2500",
    ]
    # A DPO run's line says how often the chosen answer wins (of the held-out pairs after eval_loss).
    feed(
        [
            {"event": "log", "step": 3, "max_steps": 4, "loss": 0.3, "time": 130.0, "reward_accuracy": 0.875},
            {"event": "log", "step": 3, "max_steps": 4, "eval_loss": 0.25, "time": 131.0, "eval_reward_accuracy": 0.8},
        ]
    )
    assert out.getvalue().splitlines()[-2].endswith("· loss 0.3000 · chosen wins 88%")
    assert out.getvalue().splitlines()[-1] == "step 3/4  eval_loss 0.2500 · chosen wins 80%"
    # A KTO run's, which has no pairs: the reward margin between its good and bad answers.
    feed([{"event": "log", "step": 4, "max_steps": 4, "loss": 0.2, "time": 140.0, "reward_margin": 3.25, "kl": 0.1}])
    assert out.getvalue().splitlines()[-1].endswith("· loss 0.2000 · reward margin +3.25")


def test_a_smoke_verdict_names_the_strategy_the_run_got(tmp_path):
    start = {"event": "start", "world_size": 2, "nodes": ["h", "h"], "distributed_type": "FSDP", "fsdp": True, "fsdp_version": 2,
             "trainable_params": 4096}  # fmt: skip
    logs = [{"event": "log", "step": s, "loss": 5.0 - s / 10} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [start, *logs, {"event": "end", "status": "finished"}])
    )
    assert verdict(read_records(tmp_path)).line == (
        "smoke test passed: 2 ranks on 1 machine · FSDP2 · 4,096 trainable parameters; loss 4.900 -> 4.800 over 2 steps"
    )


def test_a_starting_run_says_what_it_does_before_its_first_step(tmp_path):
    """train.py's StartupPhases writes startup.json; the progress line names the phase and its time, `runs show`
    and the page's summary how long each phase took once training began."""
    from tunedeck.backend import recipe
    from tunedeck.backend.runs.startup import breakdown, phase_now, read_phases

    phases = recipe.StartupPhases(tmp_path, rank=0)
    phases.enter("joining the other processes")
    phases.enter("loading the model")
    (_, joined), (_, loading) = read_phases(tmp_path)
    now = loading + 42.5
    line = summarize(RunRecords(), started_at=joined - 10, ended_at=None, now=now, phase=phase_now(tmp_path, now))
    assert line.progress == "step 0 · loading the model for 0:42 · elapsed 0:52"
    assert breakdown(read_phases(tmp_path)) is None  # not yet trained
    phases.enter("the first step")
    phases.enter("training")
    phases.enter("training")  # every step's end says so: the list is closed
    assert [p for p, _ in read_phases(tmp_path)] == ["joining the other processes", "loading the model",
                                                      "the first step", "training"]  # fmt: skip
    assert phase_now(tmp_path) is None
    # How long each took, from the times the file holds.
    times = [("joining the other processes", 1000.0), ("loading the model", 1003.0), ("the first step", 1045.0),
             ("training", 1050.0)]  # fmt: skip
    (tmp_path / recipe.STARTUP_FILE).write_text(json.dumps({"phases": [{"phase": p, "at": t} for p, t in times]}))
    assert breakdown(read_phases(tmp_path)) == (
        "0:50 (joining the other processes 0:03, loading the model 0:42, the first step 0:05)"
    )
    # The page names only the phases that took a second or more.
    assert (
        breakdown(read_phases(tmp_path), least_s=4)
        == "0:50 (loading the model 0:42, the first step 0:05, the rest under 4 s)"
    )
    assert breakdown(read_phases(tmp_path), least_s=60) == "0:50 (each phase under 60 s)"
    # Another rank writes its own file, not startup.json; a folder without it, or with a broken one, has no phase.
    recipe.StartupPhases(tmp_path / "other", rank=1).enter("loading the model")
    assert read_phases(tmp_path / "other") == [] and phase_now(tmp_path / "other") is None
    (tmp_path / recipe.STARTUP_FILE).write_text('{"phases": [{"phase": "x"}]}')
    assert read_phases(tmp_path) == []
    # Ended, or once a step is logged, the line is the steps' again.
    ended = summarize(RunRecords(), started_at=990.0, ended_at=1000.0, phase="loading the model for 0:10")
    assert ended.progress == "step 0 · elapsed 0:10"


def test_a_run_joining_for_long_says_what_to_check(tmp_path):
    from tunedeck.backend import recipe
    from tunedeck.backend.runs.startup import phase_now, read_phases
    from tunedeck.backend.spec import resolve_spec, spec_to_yaml

    spec = resolve_spec("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8",
                                        "launch.main_process_ip=10.0.0.1", "launch.main_process_port=29501"])  # fmt: skip
    (tmp_path / "job.yaml").write_text(spec_to_yaml(spec))
    recipe.StartupPhases(tmp_path, rank=0).enter("joining the other processes")
    ((_, began),) = read_phases(tmp_path)
    assert phase_now(tmp_path, began + 30) == "joining the other processes for 0:30"  # seconds: nothing to say yet
    # Machines started by hand may keep their ranks' files in folders of their own: none is said not to have started.
    assert phase_now(tmp_path, began + 300) == (
        "joining the other processes for 5:00 (each of the 2 machines must run launch.sh with its own MACHINE_RANK "
        "and reach 10.0.0.1:29501)"
    )
    (tmp_path / "job.yaml").write_text(spec_to_yaml(resolve_spec("demo")))
    assert phase_now(tmp_path, began + 300) == (
        "joining the other processes for 5:00 · rank 1 of 2 has not started "
        "(a process has not joined: its log under logs/ says why)"
    )


def test_a_run_waiting_for_other_ranks_names_the_one_behind(tmp_path):
    """Each rank writes its phases; once rank 0 has waited a while, the line names the rank furthest behind, with
    its host when it is another machine, or the ranks that never started."""
    from tunedeck.backend import recipe
    from tunedeck.backend.runs.startup import phase_now
    from tunedeck.backend.spec import resolve_spec, spec_to_yaml

    (tmp_path / "job.yaml").write_text(spec_to_yaml(resolve_spec("7b-lora-ddp", ["launch.num_processes=4"])))
    (tmp_path / "logs").mkdir()

    def write(rank: int, host: str, *phases: tuple[str, float]) -> None:
        path = tmp_path / recipe.STARTUP_FILE if rank == 0 else tmp_path / "logs" / f"rank{rank}.startup.json"
        path.write_text(json.dumps({"host": host, "phases": [{"phase": p, "at": t} for p, t in phases]}))

    loaded = [("importing the libraries", 1000.0), ("joining the other processes", 1005.0),
              ("loading the model", 1006.0)]  # fmt: skip
    write(0, "gpu-a", *loaded, ("loading the data", 1040.0), ("preparing the model and optimizer", 1050.0))
    write(1, "gpu-a", *loaded, ("loading the data", 1041.0), ("preparing the model and optimizer", 1052.0))
    assert phase_now(tmp_path, 1100.0) == "preparing the model and optimizer for 0:50 · ranks 2-3 of 4 have not started"
    write(2, "gpu-b", *loaded)
    write(3, "gpu-b", *loaded[:2])
    assert phase_now(tmp_path, 1055.0) == "preparing the model and optimizer for 0:05"  # waited too little to tell
    assert phase_now(tmp_path, 1100.0) == (
        "preparing the model and optimizer for 0:50 · rank 3 on gpu-b still joining the other processes for 1:35 "
        "(2 ranks behind)"
    )
    write(3, "gpu-b", *loaded, ("loading the data", 1090.0), ("preparing the model and optimizer", 1095.0))
    assert phase_now(tmp_path, 1100.0) == (
        "preparing the model and optimizer for 0:50 · rank 2 on gpu-b still loading the model for 1:34"
    )
    write(2, "gpu-b", ("importing the libraries", 100.0))  # a requeued job's earlier attempt: not this one's
    assert phase_now(tmp_path, 1100.0).endswith(" · rank 2 of 4 has not started")
    write(2, "gpu-b", *loaded, ("loading the data", 1090.0), ("preparing the model and optimizer", 1095.0))
    assert phase_now(tmp_path, 1100.0) == "preparing the model and optimizer for 0:50"  # nobody behind
    # On Slurm every node writes to the shared runs folder: a node that never started is named too.
    slurm = ["launch.backend=slurm", "launch.num_machines=2", "launch.num_processes=8"]
    (tmp_path / "job.yaml").write_text(spec_to_yaml(resolve_spec("7b-lora-ddp", slurm)))
    assert phase_now(tmp_path, 1100.0).endswith(" · ranks 4-7 of 8 have not started")


def test_runs_lists_what_a_starting_run_does(tmp_path):
    import subprocess

    from tunedeck.backend import recipe

    holder = subprocess.Popen(["sleep", "120"])  # a live process standing in for the run's supervisor
    try:
        folder = fake_run(tmp_path, RUN_ID, "running", holder)
        phases = recipe.StartupPhases(folder, rank=0)
        phases.enter("importing the libraries")
        phases.enter("loading the model")
        listing = tunedeck("runs", "--runs-dir", tmp_path).stdout
        assert re.search(rf"^{RUN_ID}\s+-\s+running\s+local\s+0 · loading the model\s", listing, re.M), listing
        # runs show says it in full: rank 0's phase, and the ranks behind it once rank 0 has waited (here none wrote).
        shown = tunedeck("runs", "show", RUN_ID, "--runs-dir", tmp_path).stdout
        assert re.search(r"^progress step 0 · loading the model for 0:0\d$", shown, re.M), shown
    finally:
        holder.kill()
