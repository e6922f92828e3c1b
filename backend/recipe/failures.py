"""What ended a run that did not finish, in one word, and whether starting it again can help (launch.max_restarts).

Torch's `--max-restarts`, SkyPilot's managed jobs and DLRover retry every failure, a wrong path too, which then
fails the same way until the retries are spent; LlamaBoard and ms-swift retry none. A run's end is classified
from what its ranks wrote (errors.jsonl, the end record), the launcher's failure summary, the signals seen and
the kernel's OOM kills, and only the classes a new attempt can cure are retried, from the newest checkpoint:

    comm       a collective timed out, a connection or a rank was lost (killed from outside)   retried
    preempted  the scheduler took the allocation back (Slurm's time limit or preemption)      retried (requeued)
    unknown    nothing above says why                                                       retried once
    oom        out of GPU or host memory: the same job fails the same way; the advisor's next
               strategy needs less memory                                                   never
    data       the data pipeline failed on a row: it fails there again                      never
    config     the job could not start (a path, a field, a library): it fails the same way   never
    disk       the disk filled up: it stays full until someone frees it                      never
    unhealthy  the training-health guard stopped it (training.health.policy=stop)           never
    stopped    someone asked it to stop                                                     never

The supervisor (backend/runs/supervisor.py) uses it for runs on this machine; slurm.sbatch runs it as
`python -m tunedeck_recipe.failures` after srun fails, and requeues the job when it says so. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RETRIED = {"comm": True, "preempted": True, "unknown": True}  # unknown: once (see retry_allowed)
ATTEMPT_ENV = "TUNEDECK_ATTEMPT"  # an attempt after the first (2, 3, ...): it resumes from the newest checkpoint

# torch.distributed.elastic's summary in the launcher log (ChildFailedError, in
# torch/distributed/elastic/multiprocessing/errors/__init__.py), one block per failed rank:
#   rank      : 1 (local_rank: 1)
#   exitcode  : -9 (pid: 11024)  (SIGKILL)
ELASTIC_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")

DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|the disk holding .* is full")
OOM_TEXT = re.compile(
    r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|can't allocate memory|std::bad_alloc|"
    r"\bMemoryError\b|Cannot allocate memory",
    re.IGNORECASE,
)
COMM_TEXT = re.compile(
    r"NCCL|collective operation timeout|Watchdog caught|ProcessGroup|\bgloo\b|Connection reset by peer|"
    r"Connection closed by peer|Connection refused|Broken pipe|DistNetworkError|DistBackendError|DistStoreError|"
    r"RendezvousError|Socket Timeout|timed out|ECONNRESET|NODE_FAIL",
    re.IGNORECASE,
)
# Where a traceback passes through the data pipeline (the loader, a collator, datasets, Arrow), or an error type
# that only data raises.
DATA_FRAMES = re.compile(
    r'File "[^"]*(torch/utils/data/|accelerate/data_loader\.py|data_collator|/datasets/|/pyarrow/)'
)
DATA_ERRORS = re.compile(r"^(UnicodeDecodeError|ArrowInvalid|ArrowTypeError|JSONDecodeError|DatasetGenerationError)")
# The stall watch's end of a run between steps (watchdog.py; launch.stop_when_stalled): most often a collective that
# never returns, which a new attempt cures; a stall before training (a reward module's import) is the job's own.
STALLED_TRAINING = re.compile(r"stalled: no training step")
NATIVE_CRASH = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE)


@dataclass(frozen=True)
class Failure:
    """How an attempt ended: its class and the one line that made it so."""

    kind: str
    reason: str

    @property
    def retried(self) -> bool:
        return RETRIED.get(self.kind, False)


def killed_rank(launcher_text: str, ours: frozenset[int] = frozenset()) -> tuple[int, int] | None:
    """(rank, signal) of a rank killed by a signal it cannot catch, from the launcher's last failure summary; the
    ranks that ended by SIGTERM (the agent's own, or a stop) and those the supervisor killed (`ours`: pids) are
    never the cause."""
    summary = launcher_text[launcher_text.rfind("Failures:") :]
    root_at = summary.find("Root Cause")
    killed = [
        (match.start() < root_at, int(match.group(1)), -int(match.group(2)))
        for match in ELASTIC_FAILURE.finditer(summary)
        if int(match.group(2)) < 0 and -int(match.group(2)) != signal.SIGTERM and int(match.group(3)) not in ours
    ]
    if not killed:
        return None
    _, rank, signum = min(killed)  # the root cause's block first
    return rank, signum


def classify(
    *,
    errors: list[dict],
    launcher_text: str,
    end: dict | None,
    stop_requested: bool = False,
    trained: bool = True,
    oom_kills: int = 0,
    ours: frozenset[int] = frozenset(),
    disk_full: bool = False,
) -> Failure:
    """The class of an attempt that did not finish.

    errors: errors.jsonl's records (the ranks that failed, first first); launcher_text: the launcher's output;
    end: rank 0's end record, if any; trained: whether a training step was finished in this attempt; oom_kills:
    the kernel's OOM kills in the run's memory cgroup during the attempt; disk_full: the run's disk has no room left
    now (a rank may have had none to say so).
    """
    status = (end or {}).get("status")
    if stop_requested or status == "stopped":
        return Failure("stopped", "it was asked to stop")
    if end and isinstance(end.get("health"), dict):
        return Failure("unhealthy", str(end.get("error") or "the training-health guard stopped it"))
    said = "\n".join(str(e.get("error") or "") for e in errors) + "\n" + launcher_text[-4096:]
    if disk_full or DISK_FULL_TEXT.search(said):  # it stays full until someone frees it: a new attempt fails too
        return Failure("disk", "the disk is full: " + (_last_matching_line(said, DISK_FULL_TEXT) or "no room left"))
    killed = killed_rank(launcher_text, ours)
    if killed is not None:
        rank, signum = killed
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        if signum == signal.SIGKILL and oom_kills:
            return Failure("oom", f"rank {rank} was killed by the kernel's OOM killer (host memory)")
        if signum in NATIVE_CRASH:
            return Failure("unknown", f"rank {rank} crashed in native code ({name})")
        return Failure("comm", f"rank {rank} was lost: killed by {name} from outside the run")
    first = errors[0] if errors else None
    if first is not None:
        error = str(first.get("error") or "")
        trace = str(first.get("traceback") or "")
        said = f"rank {first.get('rank')}: {error.splitlines()[0] if error else 'failed'}"
        if OOM_TEXT.search(error):
            return Failure("oom", said)
        if not first.get("traceback"):  # the recipe's own words: a JobError (the job's input), or its stall watch
            return Failure("comm" if STALLED_TRAINING.search(error) else "config", said)
        if DATA_ERRORS.search(error) or DATA_FRAMES.search(trace):
            return Failure("data", said)
        if COMM_TEXT.search(error):
            return Failure("comm", said)
        return Failure("unknown" if trained else "config", said)
    if oom_kills:
        return Failure("oom", "the kernel's OOM killer ended a process of the run (host memory)")
    tail = launcher_text[-4096:]
    if COMM_TEXT.search(tail):
        return Failure("comm", "the launcher lost a rank: " + _last_matching_line(tail, COMM_TEXT))
    if not trained:
        return Failure("config", "it ended before its first step without a word")
    return Failure("unknown", "a rank ended without saying why")


def retry_allowed(failure: Failure, earlier: list[dict], max_restarts: int) -> str | None:
    """None when the run starts again after `failure`; else why not. `earlier`: status.json's attempts so far."""
    if not failure.retried:
        return f"{failure.kind} is not retried: a new attempt would fail the same way"
    restarts = [a for a in earlier if a.get("end") in RETRIED]
    if len(restarts) >= max_restarts:
        return f"it was started again {len(restarts)} times already (launch.max_restarts={max_restarts})"
    if failure.kind == "unknown" and any(a.get("end") == "unknown" for a in restarts):
        return "an unknown failure is retried once"
    return None


def backoff_seconds(base_s: float, restarts_before: int) -> float:
    """The wait before a new attempt: base, doubled for each restart before it, at most 10 minutes."""
    return min(600.0, base_s * 2**restarts_before)


def oom_kills(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (cgroup v2's
    memory.events, v1's memory.oom_control); 0 where it cannot be read. A rank killed by SIGKILL while it grew was
    out of host memory."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    groups = dict(line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    candidates = []
    if "memory" in groups:  # v1: the memory controller's own tree (there /sys/fs/cgroup/memory is this group)
        candidates += [root / "memory" / groups["memory"].lstrip("/") / "memory.oom_control"]
        candidates += [root / "memory" / "memory.oom_control"]  # a container sees its own group at the top
    if "" in groups:
        candidates += [root / groups[""].lstrip("/") / "memory.events"]
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        counts = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
        if counts.get("oom_kill", "").isdigit():
            return int(counts["oom_kill"])
    return 0


def _last_matching_line(text: str, pattern: re.Pattern) -> str:
    lines = [line.strip() for line in text.splitlines() if pattern.search(line)]
    return lines[-1][:300] if lines else ""


def _json_lines(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def classify_cli(argv: list[str] | None = None) -> int:
    """For slurm.sbatch: classify the attempt that just ended in RUN_DIR and print {"kind", "reason", "retry"}."""
    from .records import ERRORS_FILE, METRICS_FILE, STOP_FILE

    parser = argparse.ArgumentParser(description="Classify how a run ended and whether to start it again.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--launcher-log", type=Path, required=True, help="the launcher's output (slurm-JOBID.out)")
    parser.add_argument("--attempts", type=Path, required=True, help="the attempts so far (a JSON list; updated)")
    parser.add_argument("--max-restarts", type=int, required=True)
    parser.add_argument("--no-requeue", action="store_true", help="the job was submitted with --no-requeue")
    args = parser.parse_args(argv)
    errors = sorted(_json_lines(args.run_dir / ERRORS_FILE), key=lambda e: e.get("time") or 0)
    records = _json_lines(args.run_dir / METRICS_FILE)
    start = max((i for i, r in enumerate(records) if r.get("event") == "start"), default=0)
    this_attempt = records[start:]
    end = next((r for r in reversed(this_attempt) if r.get("event") == "end"), None)
    try:
        launcher_text = args.launcher_log.read_text(encoding="utf-8", errors="replace")[-65536:]
    except OSError:
        launcher_text = ""
    failure = classify(
        errors=errors,
        launcher_text=launcher_text,
        end=end,
        stop_requested=(args.run_dir / STOP_FILE).exists(),
        trained=any(r.get("event") == "log" for r in this_attempt),
    )
    earlier = _json_lines(args.attempts)
    why_not = retry_allowed(failure, earlier, args.max_restarts)
    if why_not is None and args.no_requeue:
        why_not = "the job cannot go back into Slurm's queue: launch.slurm.requeue is off"
    steps = [r["step"] for r in this_attempt if r.get("event") == "log" and isinstance(r.get("step"), int)]
    attempt = {"attempt": len(earlier) + 1, "ended_at": time.time(), "end": failure.kind, "reason": failure.reason}
    attempt |= {"step": max(steps, default=None), "retried": why_not is None}
    if why_not is not None:
        attempt["not_retried"] = why_not
    with open(args.attempts, "a", encoding="utf-8") as out:
        out.write(json.dumps(attempt) + "\n")
    print(json.dumps(attempt))
    return 0 if why_not is None else 1


if __name__ == "__main__":
    sys.exit(classify_cli())
