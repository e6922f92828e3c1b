"""How a run's end is classified, and which classes start it again (backend/recipe/failures.py), on the texts the
ranks, torch's launcher and the stall watch write. Real runs of each class: tests/runs/test_restarts.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tunedeck.backend.recipe import failures
from tunedeck.backend.recipe.failures import Failure, backoff_seconds, classify, retry_allowed
from tunedeck.backend.recipe.faults import CUDA_OOM_TEXT

TRACE = 'Traceback (most recent call last):\n  File "train_sft.py", line 9, in main'


def elastic_summary(root: tuple[int, int, int], *others: tuple[int, int, int]) -> str:
    """torch.distributed.elastic's ChildFailedError summary: (rank, exit code, pid) blocks, the root cause's last."""

    def block(i: int, rank: int, code: int, pid: int) -> str:
        return (
            f"[{i}]:\n  time      : 2026-12-05_13:50:01\n  host      : box\n  rank      : {rank} (local_rank: {rank})\n"
            f"  exitcode  : {code} (pid: {pid})\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received\n"
        )

    text = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\ntrain_sft.py FAILED\n"
    text += "-" * 60 + "\nFailures:\n" + "".join(block(i + 1, *o) for i, o in enumerate(others))
    return text + "-" * 60 + "\nRoot Cause (first observed failure):\n" + block(0, *root) + "=" * 60 + "\n"


def error(text: str, trace: str | None = TRACE) -> dict:
    return {"rank": 0, "time": 1.0, "error": text, "traceback": trace}


def test_a_rank_killed_from_outside_is_a_lost_rank_unless_the_kernel_killed_it_for_memory():
    summary = elastic_summary((1, -9, 1235), (0, 1, 1234))
    lost = classify(errors=[error("RuntimeError: Connection closed by peer")], launcher_text=summary, end=None)
    assert lost == Failure("comm", "rank 1 was lost: killed by SIGKILL from outside the run") and lost.retried
    oom = classify(errors=[], launcher_text=summary, end=None, oom_kills=1)
    assert oom.kind == "oom" and "OOM killer" in oom.reason and not oom.retried
    crash = classify(errors=[], launcher_text=elastic_summary((0, -11, 99)), end=None)
    assert crash == Failure("unknown", "rank 0 crashed in native code (SIGSEGV)")
    # A rank the supervisor killed itself (its pid in `ours`), or one ended by SIGTERM, is never the cause.
    ours = classify(errors=[error("ValueError: x")], launcher_text=summary, end=None, ours=frozenset({1235}))
    assert ours.kind == "unknown"
    assert classify(errors=[], launcher_text=elastic_summary((0, -15, 5)), end=None).kind == "unknown"


@pytest.mark.parametrize(
    ("text", "trace", "kind"),
    [
        (f"OutOfMemoryError: {CUDA_OOM_TEXT}", TRACE, "oom"),
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory", TRACE, "oom"),
        ("model.name_or_path: /models/x does not exist", None, "config"),
        ("stalled: no training step for 10 min after step 812 (launch.stall_minutes)", None, "comm"),
        ("stalled: importing the reward functions for 10 min (launch.stall_minutes)", None, "config"),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", TRACE, "comm"),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", TRACE, "comm"),
        ("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0", TRACE, "data"),
        ("KeyError: 'messages'", TRACE + '\n  File "/x/torch/utils/data/_utils/fetch.py", line 55, in fetch', "data"),
        ("ZeroDivisionError: division by zero", TRACE, "unknown"),
        ("OSError: [Errno 28] No space left on device", TRACE, "disk"),
        ("output_dir: the disk holding /runs/x/output is full: checkpoint-8 did not fit", None, "disk"),
    ],
)  # fmt: skip
def test_what_the_failing_rank_wrote_says_the_class(text, trace, kind):
    assert classify(errors=[error(text, trace)], launcher_text="", end=None).kind == kind


def test_a_failure_before_the_first_step_is_the_jobs_own_unless_a_connection_was_lost():
    assert (
        classify(errors=[error("ValueError: bad config")], launcher_text="", end=None, trained=False).kind == "config"
    )
    lost = error("torch.distributed.DistNetworkError: The client socket has timed out after 600s")
    assert classify(errors=[lost], launcher_text="", end=None, trained=False).kind == "comm"
    assert classify(errors=[], launcher_text="", end=None, trained=False).kind == "config"
    assert classify(errors=[], launcher_text="", end=None).kind == "unknown"


def test_a_stop_and_the_health_guard_are_never_retried():
    assert classify(errors=[], launcher_text="", end=None, stop_requested=True).kind == "stopped"
    assert classify(errors=[], launcher_text="", end={"status": "stopped"}).kind == "stopped"
    end = {"status": "failed", "error": "⚠ unhealthy: loss NaN at step 30", "health": {"step": 30}}
    assert classify(errors=[], launcher_text="", end=end) == Failure("unhealthy", "⚠ unhealthy: loss NaN at step 30")


def test_retries_are_counted_and_an_unknown_failure_is_retried_once():
    comm, unknown = Failure("comm", "lost"), Failure("unknown", "?")
    assert retry_allowed(comm, [], 2) is None
    assert retry_allowed(comm, [{"end": "comm"}, {"end": "rolled back"}], 2) is None  # a roll-back is not a restart
    assert "launch.max_restarts=2" in str(retry_allowed(comm, [{"end": "comm"}, {"end": "unknown"}], 2))
    assert retry_allowed(comm, [], 0) is not None
    assert retry_allowed(unknown, [{"end": "comm"}], 5) is None
    assert retry_allowed(unknown, [{"end": "unknown"}], 5) == "an unknown failure is retried once"
    assert "a new attempt would fail the same way" in str(retry_allowed(Failure("oom", "x"), [], 5))
    assert [backoff_seconds(30, n) for n in range(6)] == [30, 60, 120, 240, 480, 600]


def test_the_sbatch_classifier_reads_the_run_folder_and_keeps_the_attempts(tmp_path):
    """`python -m ...failures`, as slurm.sbatch runs it after srun failed: it prints the class and exits 0 when the
    job should start again; each call adds the attempt to the attempts file."""
    records = ({"event": "start"}, {"event": "log", "step": 7})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    log, attempts = tmp_path / "slurm-5.out", tmp_path / "attempts.jsonl"
    log.write_text(elastic_summary((1, -9, 77)))
    argv = [sys.executable, "-m", "tunedeck.backend.recipe.failures", str(tmp_path), "--launcher-log", str(log)]
    argv += ["--attempts", str(attempts), "--max-restarts", "1"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    said = json.loads(first.stdout)
    assert (said["attempt"], said["end"], said["step"], said["retried"]) == (1, "comm", 7, True)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "launch.max_restarts=1" in json.loads(second.stdout)["not_retried"]
    assert [json.loads(line)["retried"] for line in attempts.read_text().splitlines()] == [True, False]
    attempts.unlink()
    off = subprocess.run([*argv, "--no-requeue"], capture_output=True, text=True, timeout=60)
    assert off.returncode == 1 and "launch.slurm.requeue is off" in json.loads(off.stdout)["not_retried"]


def test_the_kernels_oom_kills_are_read_from_the_memory_cgroup_v1_or_v2(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "user.slice" / "run").mkdir(parents=True)
    (v2 / "user.slice" / "run" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    (tmp_path / "cgroup2").write_text("0::/user.slice/run\n")
    assert failures.oom_kills(tmp_path / "cgroup2", v2) == 2
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)  # in a container: its own group is the top of the memory tree
    (v1 / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    (tmp_path / "cgroup1").write_text("4:memory:/process_api/48ec\n1:cpu:/\n0::/\n")
    assert failures.oom_kills(tmp_path / "cgroup1", v1) == 5
    assert failures.oom_kills(tmp_path / "missing", v1) == 0


def test_a_paced_step_takes_at_least_its_pace_and_an_unpaced_one_is_left_as_it_is(monkeypatch):
    import time

    from tunedeck.backend.recipe.faults import with_faults

    class Trainer:
        def training_step(self, model, inputs):
            return inputs * 2

    monkeypatch.delenv("TUNEDECK_FAULT", raising=False)
    assert with_faults(Trainer) is Trainer
    monkeypatch.setenv("TUNEDECK_FAULT", "pace=0.2")
    began = time.monotonic()
    assert [with_faults(Trainer)().training_step(None, i) for i in (1, 2)] == [2, 4]
    assert time.monotonic() - began >= 0.4
