"""The run manager's checks that need no training: ids, refusals, re-attach bookkeeping.

The GPU inventory comes from NVML, which this machine lacks: only that function is
replaced (by an inventory of four GPUs); every other part is real.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tunedeck.backend.runs import preflight
from tunedeck.backend.runs.manager import RunError, RunManager

from .helpers import fake_run


def run_folders(runs_dir) -> list[str]:
    return sorted(p.name for p in runs_dir.iterdir() if not p.name.startswith("."))


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", "20250101-120000-zzzzzz", "20250101-120000-abcdef/..", None])
def test_run_dir_rejects_anything_but_a_plain_run_id(runs_dir, bad):
    with pytest.raises(RunError, match="is not a run id"):
        RunManager(runs_dir).run_dir(bad)


def test_unknown_run_is_a_clear_error(runs_dir):
    manager = RunManager(runs_dir)
    assert manager.run_dir("20250101-120000-abcdef") == runs_dir.resolve() / "20250101-120000-abcdef"
    with pytest.raises(RunError, match="there is no run 20250101-120000-abcdef"):
        manager.status("20250101-120000-abcdef")
    assert manager.list_runs() == [] and manager.active_run() is None


def test_invalid_spec_is_refused_before_anything_is_created(runs_dir, demo_spec):
    spec = demo_spec({"strategy.kind": "fsdp", "strategy.fsdp_version": 1})  # FSDP1 on CPU silently becomes DDP
    with pytest.raises(RunError, match="strategy.fsdp_version: FSDP1 cannot run on CPU"):
        RunManager(runs_dir).start(spec)
    assert run_folders(runs_dir) == []


def test_gpu_job_without_gpu_says_what_to_do(runs_dir, demo_spec, monkeypatch):
    monkeypatch.setattr(preflight, "gpu_indices", list)
    with pytest.raises(RunError, match="no NVIDIA GPU found.*launch.use_cpu"):
        RunManager(runs_dir).start(demo_spec({"launch.use_cpu": False}))
    assert run_folders(runs_dir) == []


def test_refuses_gpus_held_by_a_live_run(runs_dir, demo_spec, monkeypatch, sleeper):
    monkeypatch.setattr(preflight, "gpu_indices", lambda: [0, 1, 2, 3])
    fake_run(runs_dir, "20250101-120000-aaaaaa", "running", sleeper, gpu_ids=[1, 2])
    (runs_dir / "20250102-120000-dddddd").mkdir()  # a newer, damaged run folder must not hide the live run's GPUs
    (runs_dir / "20250102-120000-dddddd" / "status.json").write_text('{"state": "running", "gpu_ids": "all"}')
    manager = RunManager(runs_dir)
    gpu_job = {"launch.use_cpu": False, "launch.gpu_ids": "0,1"}
    with pytest.raises(RunError, match=r"GPU 1 is in use by run 20250101-120000-aaaaaa \(m · lora · ddp · 2xGPU\)"):
        manager.start(demo_spec(gpu_job))
    with pytest.raises(RunError, match="launch.gpu_ids: GPU 7 does not exist here; this machine has GPUs 0, 1, 2, 3"):
        manager.start(demo_spec({**gpu_job, "launch.gpu_ids": "3,7"}))
    assert manager.active_run() == "20250101-120000-aaaaaa"
    assert run_folders(runs_dir) == ["20250101-120000-aaaaaa", "20250102-120000-dddddd"]  # nothing half-launched


def test_a_queued_run_holds_its_gpus_waits_for_the_runs_on_them_and_leaves_the_queue_on_stop(
    runs_dir, demo_spec, monkeypatch, sleeper
):
    monkeypatch.setattr(preflight, "gpu_indices", lambda: [0, 1, 2, 3])
    fake_run(runs_dir, "20250101-120000-aaaaaa", "running", sleeper, gpu_ids=[1, 2])
    manager = RunManager(runs_dir)
    queued = manager.start(demo_spec({"launch.use_cpu": False, "launch.gpu_ids": "0,1"}), queue=True)
    status = manager.status(queued)
    assert (status.state, status.waits_for, status.gpu_ids) == ("queued", ["20250101-120000-aaaaaa"], [0, 1])
    assert status.where == "waits for run 20250101-120000-aaaaaa to end"
    # Its GPUs are taken while it waits: a plain start on them is refused, naming it.
    with pytest.raises(RunError, match=rf"GPU 0 is in use by run {queued} .*or queue this run after it"):
        manager.start(demo_spec({"launch.use_cpu": False, "launch.gpu_ids": "0,3"}))
    # Queued on GPUs 2 and 3: after the run on GPU 2 only; the one queued on GPUs 0 and 1 is not in its way.
    second = manager.start(demo_spec({"launch.use_cpu": False, "launch.gpu_ids": "2,3"}), queue=True)
    assert manager.status(second).waits_for == ["20250101-120000-aaaaaa"]
    time.sleep(3)  # the supervisors poll each second: nothing may start while the run ahead lives
    assert [manager.status(r).state for r in (queued, second)] == ["queued", "queued"]

    for run_id in (queued, second):
        manager.stop(run_id)
    ended = [manager.wait(run_id, timeout=30) for run_id in (queued, second)]
    assert [(s.state, s.pid) for s in ended] == [("stopped", None), ("stopped", None)]  # never launched
    assert not (runs_dir / queued / "metrics.jsonl").exists()


def test_a_run_whose_processes_vanished_is_settled_as_failed(runs_dir, sleeper):
    # The supervisor (here: sleep) is alive, so the run is running; once it is gone, re-attach settles it.
    fake_run(runs_dir, "20250101-120000-bbbbbb", "running", sleeper, gpu_ids=[0])
    manager = RunManager(runs_dir)
    assert manager.status("20250101-120000-bbbbbb").state == "running"
    sleeper.kill()
    sleeper.wait()
    status = RunManager(runs_dir).status("20250101-120000-bbbbbb")
    assert status.state == "failed" and "gone" in status.error
    assert json.loads((runs_dir / "20250101-120000-bbbbbb" / "status.json").read_text())["state"] == "failed"
    assert manager.active_run() is None


@pytest.mark.parametrize(
    "recorded",
    [
        {"create_time": -3600, "since_boot": -3600},  # same pid, another process start time
        {"boot_id": "another boot"},  # same pid and time after boot, in another boot: the machine restarted
        {"create_time": -3600, "since_boot": None, "boot_id": None},  # an identity from an older tunedeck
    ],
    ids=["start-time", "boot", "wall-clock-only"],
)
def test_a_reused_pid_is_not_mistaken_for_the_run(runs_dir, sleeper, recorded):
    fake_run(runs_dir, "20250101-120000-cccccc", "running", sleeper)
    status_file = runs_dir / "20250101-120000-cccccc" / "status.json"
    data = json.loads(status_file.read_text())
    identity = data["supervisor"]
    for key, value in recorded.items():
        identity[key] = identity[key] + value if isinstance(value, int) else value
    status_file.write_text(json.dumps(data))
    assert RunManager(runs_dir).status("20250101-120000-cccccc").state == "failed"


def test_list_runs_newest_first(runs_dir):
    for run_id in ["20250101-120000-000001", "20250301-120000-000003", "20250201-120000-000002"]:
        fake_run(runs_dir, run_id, "finished", None)
    (runs_dir / "not-a-run").mkdir()
    assert [r.run_id for r in RunManager(runs_dir).list_runs()] == [
        "20250301-120000-000003",
        "20250201-120000-000002",
        "20250101-120000-000001",
    ]


def test_resume_into_a_relative_output_folder_is_refused_before_launch(runs_dir, demo_spec):
    # A relative output_dir lives inside the new run's folder: nothing to resume, the step count would restart.
    earlier = runs_dir / "20250101-120000-a1b2c3"
    (earlier / "output" / "checkpoint-30").mkdir(parents=True)
    (earlier / "status.json").write_text(
        json.dumps({"run_id": earlier.name, "state": "stopped", "title": "t", "created_at": 1.0})
    )
    spec = demo_spec({"training.resume_from_checkpoint": True})
    with pytest.raises(RunError) as refused:
        RunManager(runs_dir).start(spec)
    message = str(refused.value)
    assert message.startswith("training.resume_from_checkpoint:") and "output_dir" in message
    assert str(earlier / "output") in message  # the fix, spelled out with the run that has checkpoints
    assert run_folders(runs_dir) == [earlier.name]  # nothing was created, nothing launched
