"""Runs on the real local 2-node Slurm cluster (tests/slurm/local_cluster.py): no stand-ins for
sbatch, squeue, scontrol or scancel.

Two training runs serve every assertion (the CI budget): the demo submitted from the CLI and
followed to its end, and one run with a time limit and requeue on, which saves a checkpoint
when its time limit nears, is requeued, resumes from that checkpoint, loses a rank (SIGKILL), is
requeued by its own classifier and resumes again, and is then stopped.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunedeck.tests.runs.helpers import PACED, end_record, log_records, logs_tail, read_metrics, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
TUNEDECK = str(Path(sys.executable).parent / "tunedeck")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def squeue(job_id: str, what: str = "%T") -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", what], capture_output=True, text=True).stdout.strip()


def nodes_idle() -> bool:
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True).stdout.split()
    return bool(states) and all(state == "idle" for state in states)


def job_story(cluster, run_dir: Path, job_id: str) -> str:
    """What a failed wait shows: the run's logs, the job as slurmctld sees it and the tail of its log."""
    job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
    ctld_log = (cluster.folder / "slurmctld.log").read_text(errors="replace").splitlines()[-40:]
    return "\n".join(
        [logs_tail(run_dir), "--- scontrol show job", job.stdout + job.stderr, "--- slurmctld.log", *ctld_log]
    )


def processes_of(run_dir: Path) -> list[str]:
    """Command lines of live processes working in the run folder (launchers and ranks on both nodes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(run_dir):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def release_when_requeued(job_id: str, story) -> None:
    """Slurm holds a requeued job for 2 minutes before it may start again (BeginTime): release it now, with a
    longer limit, so that its next start is ended by the test and not by its time limit again. Released only once
    its last start has left both nodes, and in a later second of the clock: each slurmd revoked the job's
    credential when that start ended, and refuses a new one made in the same second (slurm_cred.c: ctime <=
    revoked, in whole seconds), so a job allocated then is not started but held."""
    wait_for(
        lambda: "BeginTime" in squeue(job_id, "%r") and nodes_idle(),
        120,
        1,
        lambda: "the job back in the queue\n" + story(),
    )
    time.sleep(1.1 - time.time() % 1)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now", "TimeLimit=20"], check=True)


def rank_pid(run_dir: Path, rank: int) -> int:
    """The pid of a training rank of the run (on either "node": both are this machine)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") != str(run_dir):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"train_sft.py" in cmdline and b"accelerate" not in cmdline:
            return int(pid)
    raise AssertionError(f"no rank {rank} of {run_dir} is running")


@pytest.fixture(scope="module")
def cli_run(slurm_cluster, shared_runs_dir, demo_home):
    """The done-when command: the demo on two nodes, submitted and followed by `tunedeck train`."""
    runs = shared_runs_dir / "cli"
    argv = [TUNEDECK, "train", "demo", "--runs-dir", str(runs)]
    for assignment in ("launch.backend=slurm", "launch.num_machines=2", "launch.num_processes=2"):
        argv += ["--set", assignment]
    argv += ["--set", "training.max_steps=60"]  # the preset's 600 (a minute to watch in the page) cost the suite
    # Both "nodes" are this machine: a free rendezvous port, not 29500 that another run here may hold.
    argv += ["--set", f"launch.main_process_port={free_port()}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    run_dir = next(p for p in runs.iterdir() if p.is_dir())
    return done, run_dir, runs


def test_cli_trains_the_demo_on_both_nodes(cli_run):
    done, run_dir, runs = cli_run
    assert done.returncode == 0, done.stdout + done.stderr + logs_tail(run_dir)
    # /var/tmp is a node's own folder on a real cluster: a warning (one host here), before the submission.
    assert "warning: --runs-dir:" in done.stderr and "looks like a node's own folder" in done.stderr
    lines = done.stdout.splitlines()
    running = next((i for i, line in enumerate(lines) if line.startswith("running: Slurm job")), None)
    assert running is not None, done.stdout
    # The queue state first, when the CLI saw one: on an idle cluster the job may already run at its first look.
    queued = [i for i, line in enumerate(lines) if re.match(r"queued: Slurm job \d+ · PENDING", line)]
    assert all(i < running for i in queued), done.stdout
    assert "on n0, n1" in lines[running]
    start = next(r for r in read_metrics(run_dir) if r["event"] == "start")
    assert start["world_size"] == 2 and start["nodes"] == ["n0", "n1"], start
    # Two machines: the network is measured before the model loads (launch.network_check unset = on), in seconds.
    network = start["network"]
    assert (network["machines"], network["ranks"]) == (2, 2) and network["all_ranks_gbps"] > 0, network
    assert network["seconds"] < 10, network
    print(f"2 nodes: {network['all_ranks_gbps']:.2f} GB/s between them, measured in {network['seconds']} s")
    losses = [r["loss"] for r in log_records(run_dir)]
    assert losses[-1] < losses[0] / 2, losses
    assert end_record(run_dir)["status"] == "finished"
    job_id = re.search(r"Slurm job (\d+)", lines[running]).group(1)
    listed = subprocess.run([TUNEDECK, "runs", "--runs-dir", str(runs)], capture_output=True, text=True)
    assert re.search(rf"{run_dir.name}\s+\S+\s+finished\s+slurm:{job_id}\s", listed.stdout), listed.stdout
    shown = subprocess.run(
        [TUNEDECK, "runs", "show", run_dir.name, "--runs-dir", str(runs)], capture_output=True, text=True
    )
    assert f"Slurm job {job_id} · COMPLETED" in shown.stdout, shown.stdout
    said = f"network  measured {network['all_ranks_gbps']:.1f} GB/s between machines; the estimate assumed"
    assert said in shown.stdout, shown.stdout
    assert not processes_of(run_dir)


def test_time_limit_saves_requeue_resumes_and_stop_leaves_a_checkpoint(
    slurm_cluster, shared_runs_dir, demo_spec, monkeypatch
):
    from tunedeck.backend.runs.manager import RunManager

    monkeypatch.setenv(*PACED)  # sbatch passes it on: for minutes the job only waits for its time limit

    manager = RunManager(shared_runs_dir / "requeue")
    spec = demo_spec(
        {
            "launch.backend": "slurm",
            "launch.num_machines": 2,
            "launch.num_processes": 2,
            "launch.main_process_port": free_port(),
            "launch.slurm.time_limit": "3",  # minutes
            # 60 s before the limit, and Slurm sends it up to 60 s earlier still: 60 to 120 s after the job started,
            # after its first step. With 100 (20 to 80 s) a CI under load had the signal before the first step: no
            # checkpoint, and the requeued job started again from step 0.
            "launch.slurm.signal_before_s": 60,
            "launch.slurm.requeue": True,
            "launch.restart_backoff_s": 1,
            "training.max_steps": 100000,
            "training.save_steps": 100000,  # no checkpoint of its own: each one comes from a signal
        }
    )
    run_id = manager.start(spec)
    run_dir = manager.run_dir(run_id)
    job_id = manager.status(run_id).slurm["job_id"]
    checkpoints = run_dir / "output"
    try:

        def starts() -> list[dict]:
            return [r for r in read_metrics(run_dir) if r["event"] == "start"]

        def stepped_since_the_last_start() -> bool:  # a record of the previous start would pass a plain "> saved_step"
            records = read_metrics(run_dir)
            last_start = max(i for i, r in enumerate(records) if r["event"] == "start")
            return any(r["event"] == "log" and "loss" in r for r in records[last_start:])

        def story() -> str:  # read when a wait fails: the logs and the queue then
            return job_story(slurm_cluster, run_dir, job_id)

        # The time limit nears: SIGTERM, a checkpoint, and (requeue on) the job goes back into the queue.
        first = wait_for(
            lambda: list(checkpoints.glob("checkpoint-*")), 300, 1, lambda: "the time limit's checkpoint\n" + story()
        )
        saved_step = int(first[0].name.split("-")[1])
        assert saved_step > 0, logs_tail(run_dir)
        release_when_requeued(job_id, story)
        # The same job starts again and resumes from that checkpoint.
        wait_for(lambda: len(starts()) == 2, 300, 1, lambda: "the requeued job's start record\n" + story())
        assert starts()[1]["resumed_from_step"] == saved_step
        assert not (run_dir / "stop.request").exists()  # the stop that ended the last start is done
        status = manager.status(run_id)
        assert status.state == "running" and status.slurm["job_id"] == job_id
        wait_for(stepped_since_the_last_start, 120, 1, "a step after the resume")

        # Rank 1 is lost (SIGKILL from outside): slurm.sbatch classifies the failure (comm), records the attempt and
        # requeues the job, which resumes from the newest checkpoint again (launch.max_restarts, the panel's rule).
        os.kill(rank_pid(run_dir, 1), signal.SIGKILL)
        wait_for(lambda: manager.status(run_id).attempts, 120, 1, lambda: "the classified attempt\n" + story())
        [attempt] = manager.status(run_id).attempts
        assert (attempt["attempt"], attempt["end"], attempt["retried"]) == (1, "comm", True), attempt
        release_when_requeued(job_id, story)
        wait_for(lambda: len(starts()) == 3, 300, 1, lambda: "the restarted job's start record\n" + story())
        assert starts()[2]["resumed_from_step"] == saved_step and (run_dir / "errors.attempt-1.jsonl").exists()
        wait_for(stepped_since_the_last_start, 120, 1, "a step after the restart")

        # Stop: the ranks save a checkpoint and exit; nothing is left in the queue or on the machine.
        stopped_at = time.time()
        manager.stop(run_id, grace_s=60)
        final = manager.wait(run_id, timeout=120)
        assert final.state == "stopped", (final, logs_tail(run_dir))
        assert time.time() - stopped_at < 60  # the ranks saved and exited; no kill after the grace period
        steps = sorted(int(p.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*"))
        assert steps[-1] > saved_step, steps
        wait_for(lambda: squeue(job_id) == "", 60, 1, "the job to leave the queue")
        wait_for(lambda: not processes_of(run_dir), 30, 1, "no process of the run")
    finally:  # a failed story must not leave its job training beside the next tests
        subprocess.run(["scancel", job_id], capture_output=True)
