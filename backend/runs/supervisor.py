"""The run supervisor: a small process that owns one run's launcher from start to exit.

    python backend/runs/supervisor.py RUN_DIR     (it needs only psutil: no tunedeck import)

Started by the run manager in its own session, it starts the launcher (argv and environment
recorded in status.json), records pids and start times, carries out a stop request (a
`stop.request` file, or SIGTERM to the supervisor when the folder was deleted) and writes the
final state and exit code to status.json. It outlives the manager: a panel restart re-attaches
by reading status.json (is_alive checks the processes recorded). A run queued after others
(`waits_for` in status.json) waits here until each of them has ended, then starts.

Stop: SIGTERM to the ranks, which finish their step, save a checkpoint and exit; not to the
launcher, whose elastic agent kills its workers 30 s after a SIGTERM (a large checkpoint cut
in half), nor to its process group (each rank has a session of its own). After the grace
period, SIGKILL to every process of the run. As a child subreaper it keeps ranks orphaned by
a dead launcher, and kills whatever is left when the launcher exits.

A full disk must not leave a run "running" forever: the supervisor deletes the reserve file the
manager wrote into the run folder to write the final status when nothing else fits. One file on
purpose: a script with nothing but psutil, it spells the run folder's names itself
(backend/runs/folder.py owns them; a contract test compares the two).

The supervisor posts how the run ended to $TUNEDECK_NOTIFY_URL, after it has written the final state
(a webhook that never answers cannot hold the run open, nor a run queued after it: the queue reads the
final state), with its sibling train.py's notify (one message format, the POST bounded in time), loaded
only then. It keeps the variable from the ranks, so rank 0 does not post as well (it does under
`launch.sh` and Slurm, where no supervisor runs).

What the run got is the truth, not the exit code: a run whose rank 0 left before its last step without
its end record (os._exit(0) in a library, a reward) or with an end record short of its max steps has
failed, whatever the launcher's exit code says.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Set
from pathlib import Path
from typing import TypeGuard

import psutil


def recipe_module(name: str):
    """A module of the recipe package (backend/recipe/, standard library only at import), loaded by its path as the
    bundle's train_sft.py loads it by its folder: this script runs alone (python supervisor.py), not as tunedeck."""
    import importlib
    import importlib.util

    if "tunedeck_recipe" not in sys.modules:
        folder = Path(__file__).resolve().parent.parent / "recipe"
        spec = importlib.util.spec_from_file_location(
            "tunedeck_recipe", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        if spec is None or spec.loader is None:
            raise ImportError(f"no recipe package at {folder}")
        package = importlib.util.module_from_spec(spec)
        sys.modules["tunedeck_recipe"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"tunedeck_recipe.{name}")


# The run folder's names, the stall rule and the notification's variable, as the recipe writes and reads them.
# (_records below is this module's reader of errors.jsonl: the recipe's module goes by another name.)
_recipe_records, _watchdog = recipe_module("records"), recipe_module("watchdog")
STOP_FILE, METRICS_FILE, ERRORS_FILE = (
    _recipe_records.STOP_FILE,
    _recipe_records.METRICS_FILE,
    _recipe_records.ERRORS_FILE,
)
PROGRESS_FILE, STARTUP_FILE = _recipe_records.PROGRESS_FILE, _recipe_records.STARTUP_FILE
STALL_GAP_FACTOR, WATCHED_PHASES = _watchdog.STALL_GAP_FACTOR, _watchdog.WATCHED_PHASES
NOTIFY_ENV = recipe_module("notifications").NOTIFY_ENV
_failures = recipe_module("failures")  # how an attempt ended, and whether another one can help
ROLLBACK_ENV, ROLLBACK_FILE = recipe_module("rollback").ROLLBACK_ENV, _recipe_records.ROLLBACK_FILE
STATUS_FILE = "status.json"
LAUNCHER_LOG = "logs/launcher.log"
RESERVE_FILE = ".disk-reserve"  # room kept for the final status.json on a disk that fills up
DEFAULT_GRACE_S = 60.0
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
POLL_S = 0.2
QUEUE_POLL_S = 1.0  # how often a queued run looks whether the runs ahead of it have ended
# After a rank failed, the others get this long to end on their own (one blocked in a collective on
# its dead peer ignores SIGTERM for minutes); then they are killed, and the launcher gets the summary
# grace to print its failure summary (it names a rank that died by a signal) and exit.
FAILURE_GRACE_S = 5.0
SUMMARY_GRACE_S = 10.0
ERROR_LINES = 20
STALL_CHECK_S = 1.0
ENDED_STATES = ("finished", "failed", "stopped")


# ---------------------------------------------------------------- status.json


def write_status(run_dir: Path, status: dict) -> None:
    """Atomic replace: a reader never sees a half-written file."""
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, run_dir / STATUS_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not also collect half-written copies
        raise


def update_status(run_dir: Path, **changes) -> dict:
    status = json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))
    if not isinstance(status, dict):
        raise ValueError(f"{STATUS_FILE} holds a JSON {type(status).__name__}, not an object")
    status.update(changes)
    write_status(run_dir, status)
    return status


def record_end(run_dir: Path, tries: int = 10, retry_s: float = 3.0, **changes) -> str | None:
    """Write the run's final state; on a full disk, free the reserve and retry. Returns why it could not, or None."""
    problem = None
    for attempt in range(tries):
        try:
            try:
                update_status(run_dir, **changes)
            except (ValueError, FileNotFoundError):
                if not run_dir.is_dir():
                    return "the run folder was deleted"
                # status.json was damaged or removed by hand: what we know beats nothing
                write_status(run_dir, {"run_id": run_dir.name, **changes})
            return None
        except OSError as exc:
            problem = f"cannot write {run_dir / STATUS_FILE}: {exc.strerror or exc}"
            if exc.errno not in DISK_FULL:
                return problem
            if (run_dir / RESERVE_FILE).exists():
                (run_dir / RESERVE_FILE).unlink()
                if changes.get("state") == "failed":
                    changes["error"] = disk_full_message(run_dir, changes.get("error"))
            elif attempt + 1 < tries:
                time.sleep(retry_s)  # something else on this disk may free space
    return problem


def disk_is_full(run_dir: Path) -> bool:
    """Less than 1 MiB free where the run writes (the recipe's rule for a save cut short): a rank that failed
    then may have had no room to say why."""
    try:
        return shutil.disk_usage(run_dir).free < 2**20
    except OSError:
        return False


def disk_full_message(run_dir: Path, error: str | None) -> str:
    headline = (
        f"the disk holding {run_dir} is full (No space left on device): free space, then start the job again; "
        "training.resume_from_checkpoint continues from the last complete checkpoint"
    )
    return headline if not error or headline in error else f"{headline}\n{error}"


BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")  # Linux: a process recorded in another boot is gone


def boot_id() -> str | None:
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:  # not Linux
        return None


def since_boot(proc: psutil.Process) -> float:
    """When it started, in seconds after boot: create_time less the boot time, which moves with the clock."""
    return proc.create_time() - psutil.boot_time()


def is_alive(identity: dict | None) -> TypeGuard[dict]:
    """Whether the process recorded (process_identity) is still the one running."""
    if not identity or not identity.get("pid"):
        return False
    try:
        proc = psutil.Process(identity["pid"])
        if identity.get("boot_id") and identity.get("since_boot") is not None:
            same = identity["boot_id"] == boot_id() and abs(since_boot(proc) - identity["since_boot"]) < 0.5
        else:  # recorded where there is no boot id (or by an older tunedeck): its wall-clock start time
            same = abs(proc.create_time() - identity["create_time"]) < 0.5
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def process_identity(pid: int) -> dict:
    """pid plus start time: a pid alone may have been reused by an unrelated process. The start time
    after boot (as in psutil's own identity on Linux) stays true when the wall clock is stepped."""
    proc = psutil.Process(pid)
    return {"pid": pid, "create_time": proc.create_time(), "since_boot": since_boot(proc), "boot_id": boot_id()}


# ---------------------------------------------------------------- how a run ended


def json_objects(lines) -> list[dict]:
    """The JSON objects among lines (str or bytes); damaged lines (cut short, not an object) are skipped."""
    values = []
    for line in lines:
        with contextlib.suppress(ValueError):
            values.append(json.loads(line))
    return [value for value in values if isinstance(value, dict)]


def _tail_text(path: Path, size: int = 65536) -> str:
    """The end of a file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def end_record(run_dir: Path, since: int = 0) -> dict | None:
    """The training's own {"event": "end"} record from metrics.jsonl, if it wrote one (after byte `since`: the
    current attempt's)."""
    records = _records_since(run_dir, since)
    return next((record for record in reversed(records) if record.get("event") == "end"), None)


def _records_since(run_dir: Path, since: int) -> list[dict]:
    """metrics.jsonl's records after byte `since`, at most its last 64 KiB."""
    path = run_dir / METRICS_FILE
    try:
        with open(path, "rb") as f:
            f.seek(max(since, file_size(path) - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return json_objects(text.splitlines())


SIGNAL_NAMES = {sig.value: sig.name for sig in signal.Signals}
SIGNAL_CAUSES: dict[int, str] = {
    signal.SIGKILL: "out of memory (the kernel's OOM killer: see `dmesg`) or killed by hand",
    **dict.fromkeys((signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT), "a crash in native code: its log has the stack"),
}
ATTEMPT_MARK = "==> tunedeck: attempt "  # a line of the launcher log before each attempt's launcher starts


def launcher_text(run_dir: Path) -> str:
    """The launcher log's tail, from the current attempt's first line on."""
    text = _tail_text(run_dir / LAUNCHER_LOG)
    at = text.rfind(ATTEMPT_MARK)
    return text[text.find("\n", at) + 1 :] if at >= 0 else text  # after the mark's own line


def killed_rank(run_dir: Path, ours: Set[int] = frozenset()) -> tuple[int, int] | None:
    """(rank, signal) of a rank killed by a signal it cannot catch, from the launcher's failure summary.

    A rank killed this way writes nothing itself, and the others then fail with a lost
    connection ("Connection reset by peer"), which must not be taken for the cause. The
    agent sends SIGTERM to the surviving ranks itself, and train.py turns any other SIGTERM
    into a graceful stop: a rank that ended by SIGTERM is never the cause, nor one that we
    killed ourselves (`ours`: pids).
    """
    return _failures.killed_rank(launcher_text(run_dir), frozenset(ours))


def _rank_errors(run_dir: Path) -> list[dict]:
    try:
        return json_objects((run_dir / ERRORS_FILE).read_text(encoding="utf-8", errors="replace").splitlines())
    except FileNotFoundError:
        return []


def first_failure(run_dir: Path, ours: Set[int] = frozenset()) -> str | None:
    """Why the run failed: a rank killed by a signal, else the rank that failed first (train.py's
    errors.jsonl), else the launcher log's tail."""
    failures = sorted(_rank_errors(run_dir), key=lambda f: at if isinstance(at := f.get("time"), (int, float)) else 0)
    killed = killed_rank(run_dir, ours)
    if killed:
        rank, signum = killed
        lines = [
            f"rank {rank} was killed by {SIGNAL_NAMES.get(signum, f'signal {signum}')} (signal {signum}): "
            f"{SIGNAL_CAUSES.get(signum, 'stopped from outside the run')}; see logs/rank{rank}.log"
        ]
        lines += [f"then rank {f.get('rank')} failed: {f.get('error')}" for f in failures[:1]]
        return "\n".join(lines)
    if failures:
        first = failures[0]
        trace = [line for line in str(first.get("traceback") or "").splitlines() if line.strip()]
        if len(trace) > ERROR_LINES:
            trace = ["  ...", *trace[-ERROR_LINES:]]
        return "\n".join([f"rank {first.get('rank')} failed first: {first.get('error')}", *trace])
    lines = [line for line in launcher_text(run_dir).splitlines() if line.strip()][-ERROR_LINES:]
    return "\n".join(lines) or None


def steps_done(run_dir: Path) -> tuple[int | None, int | None]:
    """(the last step rank 0 finished, the run's max steps), from its own records: progress.json, and the newest
    record of metrics.jsonl that names max_steps (a log record, or the start record); None where they say nothing."""
    step = max_steps = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        step = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8")).get("step")
    for record in reversed(_records(run_dir)):
        if step is None and record.get("event") == "log":
            step = record.get("step")
        if max_steps is None and record.get("event") in ("log", "start"):
            max_steps = record.get("max_steps")
    ints = [value if isinstance(value, int) and not isinstance(value, bool) else None for value in (step, max_steps)]
    return ints[0], ints[1]


def _records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records in its first and last 64 KiB: the start records (at its head, before a long run's
    log records) and the newest ones."""
    path = run_dir / METRICS_FILE
    try:
        with open(path, "rb") as f:
            head = f.read(65536).decode("utf-8", "replace")
    except FileNotFoundError:
        return []
    tail = _tail_text(path)
    text = head if len(head) < 65536 else head.rsplit("\n", 1)[0] + "\n" + tail.split("\n", 1)[-1]
    return json_objects(text.splitlines())


def short_of_its_end(run_dir: Path) -> str | None:
    """'at step 3 of 60' when rank 0's last step is before its max steps; None when it got there, or its records
    do not say."""
    step, max_steps = steps_done(run_dir)
    if step is None or max_steps is None or step >= max_steps:
        return None
    return f"at step {step} of {max_steps}"


def final_state(
    run_dir: Path, exit_code: int | None, stop_requested: bool, ours: Set[int] = frozenset(), since: int = 0
) -> tuple[str, str | None]:
    """(state, error) of a run whose launcher has exited: what the run's own records say it got, not its exit code.
    A run "finished" only when rank 0 wrote so in its end record, at its last step (records after byte `since`:
    the last attempt's)."""
    end = end_record(run_dir, since)
    trained = end.get("status") if end else None
    short = short_of_its_end(run_dir) if trained in (None, "finished") else None
    if trained == "finished" and not short:
        return "finished", None
    if stop_requested:
        return "stopped", None
    if end and isinstance(end.get("health"), dict) and isinstance(end.get("error"), str):
        return "failed", end["error"]  # the health guard stopped it: its line says what it saw, and the hints
    if exit_code == 0 and trained == "stopped":  # a SIGTERM from outside (Slurm's time limit): saved and stopped
        return "stopped", None
    if exit_code == 0:  # every rank exited 0, yet rank 0 did not record the end of its training
        step, max_steps = steps_done(run_dir)
        where = short or (f"at step {step} of {max_steps}" if step is not None else "before training began")
        if trained == "finished":
            return "failed", (
                f"rank 0 ended its training {where} and wrote it finished: a run that ends before its last step has "
                "not finished (training.max_steps); its log says why it stopped early"
            )
        return "failed", (
            f"rank 0 exited with code 0 {where} without its end record: something in the run ended it early "
            "(a library or a reward calling exit); see logs/rank0.log"
        )
    headline = f"the launcher exited with code {exit_code}" if exit_code is not None else "the run's processes are gone"
    error = first_failure(run_dir, ours) or headline
    # ENOSPC's own words, or the disk as it is now when the ranks had no room to say it (a rank's own words first)
    if "No space left on device" in error or (disk_is_full(run_dir) and "is full" not in error):
        error = disk_full_message(run_dir, error)
    return "failed", error


# ---------------------------------------------------------------- a run that stopped making progress


class StallWatch:
    """Tells when rank 0 finishes no training step for longer than the run's limit (status.json's "stall").

    Progress is progress.json's step, micro-batch and forward-pass counts (GRPO's writing answers), timed on this process's monotonic clock as they are
    seen to change. The watch starts with the first progress record (training began: loading, however long, is
    not watched). The limit is after_s, and at least STALL_GAP_FACTOR times the longest gap seen so far, so a run
    whose evaluations take long is not called stalled for them; nor while rank 0 saves ("saving"). Stalled,
    status.json says since when (the page and `tunedeck runs show` say so); a step clears it. Each rank's own
    watchdog (train.py's StallWatchdog, on the same rule) writes its stack to its log, and ends the run with
    launch.stop_when_stalled. Before training, a startup phase that runs your code (WATCHED_PHASES: importing the
    reward functions) is watched the same way, from startup.json: stalled once it lasts longer than after_s.

    It also carries the run's own warning (progress.json's "warning": a reward that scored no answer of a step)
    into status.json, for the run's state line.
    """

    def __init__(self, run_dir: Path, settings: dict | None):
        self.run_dir = run_dir
        self.after_s = float((settings or {}).get("after_s") or 0)
        self.step: int | None = None
        self.seen: tuple | None = None  # (step, micro-batches, forward passes) last seen
        self.seen_at = self.longest_gap = self.checked_at = 0.0
        self.stalled = False
        self.warning: str | None = None

    def _read(self) -> dict | None:
        try:
            data = json.loads((self.run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
            return data if isinstance(data.get("step"), int) else None
        except (OSError, ValueError, AttributeError):
            return None

    def carry_warning(self, progress: dict | None = None) -> None:
        """Copy progress.json's warning into status.json when it changes (also once the run has ended)."""
        progress = self._read() if progress is None else progress
        warning = progress.get("warning") if progress else None
        if isinstance(warning, str) and warning != self.warning:
            self.warning = warning
            _note(self.run_dir, warning=warning)

    def _watched_phase(self) -> tuple[str, float] | None:
        """(phase, began at) when rank 0 is in a startup phase of WATCHED_PHASES, from startup.json."""
        try:
            phase = json.loads((self.run_dir / STARTUP_FILE).read_text(encoding="utf-8"))["phases"][-1]
            name, began = phase["phase"], float(phase["at"])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None
        return (name, began) if name in WATCHED_PHASES else None

    def _check_phase(self) -> None:
        """Before training: stalled once a watched phase lasts longer than after_s (wall clock: startup.json's)."""
        watched = self._watched_phase()
        if watched is None:
            if self.stalled:  # the phase ended: the next one is not watched
                self.stalled = False
                _note(self.run_dir, stalled=None)
            return
        phase, began = watched
        if not self.stalled and time.time() - began > self.after_s:
            self.stalled = True
            _note(self.run_dir, stalled={"step": 0, "since": began, "limit_s": self.after_s, "phase": phase})
            print(f"supervisor: {phase} for {time.time() - began:.0f} s: stalled", file=sys.stderr, flush=True)

    def check(self, now: float) -> None:
        if now - self.checked_at < STALL_CHECK_S:
            return
        self.checked_at = now
        progress = self._read()
        self.carry_warning(progress or {})
        if not self.after_s:
            return
        if progress is None:  # training has not begun: only a watched phase is watched (a step then clears it)
            self._check_phase()
            return
        if progress.get("saving"):  # a checkpoint save, however long, is no stall, and its time no step's gap
            self.seen_at = now
            return
        seen = (progress["step"], progress.get("micro"), progress.get("forwards"))
        if seen != self.seen:  # a micro-batch, or a forward pass writing answers, is progress too
            if self.step is not None and not self.stalled:  # a stall's gap would raise the limit for good
                self.longest_gap = max(self.longest_gap, now - self.seen_at)
            self.step, self.seen, self.seen_at = progress["step"], seen, now
            if self.stalled:
                self.stalled = False
                _note(self.run_dir, stalled=None)
                print(
                    f"supervisor: the run moves again (step {self.step}): no longer stalled",
                    file=sys.stderr,
                    flush=True,
                )
            return
        limit = max(self.after_s, STALL_GAP_FACTOR * self.longest_gap)
        if not self.stalled and now - self.seen_at > limit:
            self.stalled = True
            _note(self.run_dir, stalled={"step": self.step, "since": progress.get("time"), "limit_s": limit})
            print(
                f"supervisor: no step after step {self.step} for {now - self.seen_at:.0f} s: stalled",
                file=sys.stderr,
                flush=True,
            )


# ---------------------------------------------------------------- supervising


def _become_subreaper() -> None:
    """Adopt orphaned descendants (Linux): if the launcher dies first, its ranks become ours, not init's."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the final sweep still kills the launcher's tree


def _children(pid: int, recursive: bool = False) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=recursive)
    except psutil.NoSuchProcess:
        return []


def kill_tree(processes: list[psutil.Process], sig: int = signal.SIGKILL, timeout: float = 5.0) -> None:
    """Signal processes and wait (reaping our own children) until they are gone."""
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
    psutil.wait_procs(processes, timeout=timeout)


def _kill_run(launcher: subprocess.Popen) -> None:
    """SIGKILL every process of the run. The launcher is reaped by its Popen, which keeps its exit code."""
    others = [p for p in _children(os.getpid(), recursive=True) if p.pid != launcher.pid]
    launcher.kill()
    kill_tree(others)
    launcher.wait()


def _note(run_dir: Path, **changes) -> None:
    """A status change on the way (not the end): on a full disk it waits for the final record."""
    try:
        update_status(run_dir, **changes)
    except (OSError, ValueError) as exc:
        print(f"supervisor: cannot write {run_dir / STATUS_FILE}: {exc}", file=sys.stderr, flush=True)


def supervise(run_dir: Path) -> int:
    run_dir = run_dir.resolve()
    stop_signal = threading.Event()  # SIGTERM to the supervisor asks for a stop, as the stop.request file does
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_signal.set())
    try:
        status = update_status(run_dir, supervisor=process_identity(os.getpid()))
    except (OSError, ValueError) as exc:
        # Unrecorded, nobody could follow or stop the run: do not start it.
        record_end(
            run_dir, state="failed", ended_at=time.time(), error=f"the supervisor could not record itself: {exc}"
        )
        return 1
    # The manager may be asked to stop before we even start (or while queued): then there is nothing to run.
    if not _wait_for_runs_ahead(run_dir, status.get("waits_for") or [], stop_signal):
        record_end(run_dir, state="stopped", ended_at=time.time(), exit_code=None)
        return 0
    _become_subreaper()
    started_at, attempts, extra_env = time.time(), [], {}
    max_restarts, backoff_s = _restart_policy(status.get("restarts"))
    while True:
        since = file_size(run_dir / METRICS_FILE)  # this attempt's records begin here
        attempt_started, kills_before = time.time(), _failures.oom_kills()
        outcome = _attempt(run_dir, status, stop_signal, extra_env, started_at, len(attempts) + 1)
        if outcome is None:
            return 1  # could not start or record the launcher: recorded as failed already
        exit_code, stopping, killed = outcome
        rollback = _rollback_asked(run_dir, since) if not stopping else None
        if rollback is not None:
            # The health guard ended this attempt to roll back: start the next one from its checkpoint.
            attempts.append({"attempt": len(attempts) + 1, "ended_at": time.time(), "end": "rolled back", **rollback})
            _note(run_dir, attempts=attempts)
            extra_env = {ROLLBACK_ENV: str(run_dir / ROLLBACK_FILE)}
            continue
        state, error = final_state(run_dir, exit_code, stopping, killed, since)
        if state != "failed":
            break
        failure = _classify(run_dir, since, stopping, killed, _failures.oom_kills() - kills_before)
        why_not = _failures.retry_allowed(failure, attempts, max_restarts)
        step, _ = steps_done(run_dir)
        ended = {"attempt": len(attempts) + 1, "started_at": attempt_started, "ended_at": time.time()}
        ended |= {"end": failure.kind, "reason": failure.reason, "step": step, "retried": why_not is None}
        if why_not is not None:
            _note(run_dir, failure={"kind": failure.kind, "reason": failure.reason, "not_retried": why_not})
            if attempts:  # a run started again lists every attempt, the last one too
                _note(run_dir, attempts=[*attempts, ended])
            break
        attempts.append(ended)
        wait_s = _failures.backoff_seconds(backoff_s, len(attempts) - 1)
        _note(run_dir, attempts=attempts, restarting={"at": time.time() + wait_s, "after": failure.kind})
        if _stopped_while_waiting(run_dir, stop_signal, wait_s):
            state, error = "stopped", None
            break
        _set_aside(run_dir / ERRORS_FILE, len(attempts))  # the next attempt's failure watch starts clean
        # A roll-back stays with the attempts after it: its scaled learning rate and skipped window (recipe/rollback.py).
        extra_env = {**extra_env, _failures.ATTEMPT_ENV: str(len(attempts) + 1)}
    problem = record_end(run_dir, state=state, ended_at=time.time(), exit_code=exit_code, error=error, restarting=None)
    post_how_it_ended(
        run_dir, state, error, time.time() - started_at
    )  # after the end is recorded: bounded, never first
    if problem and run_dir.is_dir():
        # The manager settles the run from metrics.jsonl and errors.jsonl once it sees us gone.
        print(f"supervisor: the run ended {state}, but {problem}", file=sys.stderr, flush=True)
        return 1
    return 0  # recorded, or its folder was deleted: nothing to record into


def _restart_policy(restarts: dict | None) -> tuple[int, float]:
    """(new attempts allowed, the first wait in seconds) from status.json's restarts (none: no restarts)."""
    restarts = restarts if isinstance(restarts, dict) else {}
    try:
        return int(restarts.get("max", 0)), float(restarts.get("backoff_s", 0.0))
    except (TypeError, ValueError):
        return 0, 0.0


def _stopped_while_waiting(run_dir: Path, stop_signal: threading.Event, wait_s: float) -> bool:
    """Wait `wait_s` before the next attempt; True as soon as a stop is asked for (stop.request, or SIGTERM)."""
    deadline = time.monotonic() + wait_s
    while not (stop_signal.is_set() or (run_dir / STOP_FILE).exists()):
        if time.monotonic() >= deadline:
            return False
        stop_signal.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))
    return True


def file_size(path: Path) -> int:
    """A file's size in bytes, 0 when it is not there (yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _set_aside(path: Path, attempt: int) -> None:
    """errors.jsonl of an attempt that is started again, kept as errors.attempt-N.jsonl."""
    with contextlib.suppress(OSError):
        path.rename(path.with_name(f"{path.stem}.attempt-{attempt}{path.suffix}"))


def _classify(run_dir: Path, since: int, stopping: bool, killed: set[int], oom_kills: int):
    """How the attempt whose records begin at byte `since` of metrics.jsonl ended (recipe's failures.classify)."""
    records = _records_since(run_dir, since)
    errors = sorted(_rank_errors(run_dir), key=lambda f: at if isinstance(at := f.get("time"), (int, float)) else 0)
    return _failures.classify(
        errors=errors,
        launcher_text=launcher_text(run_dir),
        end=next((r for r in reversed(records) if r.get("event") == "end"), None),
        stop_requested=stopping,
        trained=any(r.get("event") == "log" for r in records),
        oom_kills=oom_kills,
        ours=frozenset(killed),
        disk_full=disk_is_full(run_dir),
    )


def _rollback_asked(run_dir: Path, since: int) -> dict | None:
    """What the attempt that just ended asked to roll back to (rank 0's end record says rollback, and its
    rollback.json is there), or None."""
    end = end_record(run_dir, since)
    if not end or end.get("status") != "rollback":
        return None
    try:
        plan = json.loads((run_dir / ROLLBACK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(plan, dict):
        return None
    symptom = plan.get("symptom")
    symptom = symptom if isinstance(symptom, dict) else {}
    return {
        "reason": f"{symptom.get('text', 'unhealthy')} at step {symptom.get('step', plan.get('bad_step'))}",
        **{key: plan.get(key) for key in ("bad_step", "checkpoint_step", "skip_steps", "lr_scale", "rollbacks")},
    }


def _attempt(
    run_dir: Path, status: dict, stop_signal: threading.Event, extra_env: dict, started_at: float, number: int
) -> tuple[int | None, bool, set[int]] | None:
    """One start of the launcher, watched until it exits: (exit code, stop requested, pids we killed); None when it
    could not start or be recorded (the end is recorded then)."""
    try:
        with open(run_dir / LAUNCHER_LOG, "ab") as log:
            log.write(f"{ATTEMPT_MARK}{number}\n".encode())
            log.flush()
            launcher = subprocess.Popen(
                status["argv"],  # in the run's environment: the manager started us with it, less the webhook
                cwd=run_dir,
                env={name: value for name, value in os.environ.items() if name != NOTIFY_ENV} | extra_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C or signal meant for us does not reach the run
            )
    except OSError as exc:
        record_end(run_dir, state="failed", ended_at=time.time(), error=f"could not start {status['argv'][0]}: {exc}")
        return None
    try:
        update_status(
            run_dir,
            state="running",
            restarting=None,
            started_at=started_at,
            launcher={**process_identity(launcher.pid), "pgid": launcher.pid},
        )
    except (OSError, ValueError) as exc:
        # Unrecorded, the launcher could not be found by anyone else: end the run at once, and say why.
        _kill_run(launcher)
        record_end(
            run_dir,
            state="failed",
            ended_at=time.time(),
            exit_code=launcher.returncode,
            error=f"could not record the launcher: {exc}",
        )
        return None
    stop_since = stop_deadline = failed_since = None
    signalled: set[int] = set()
    killed: set[int] = set()  # ranks we killed: never reported as the cause of a failure
    watch = StallWatch(run_dir, status.get("stall"))
    while launcher.poll() is None:
        if stop_deadline is None and failed_since is None:
            watch.check(time.monotonic())
        if failed_since is None and (run_dir / ERRORS_FILE).exists():
            failed_since = time.monotonic()
        if failed_since is not None and time.monotonic() > failed_since + FAILURE_GRACE_S + SUMMARY_GRACE_S:
            _kill_run(launcher)
        elif failed_since is not None and time.monotonic() > failed_since + FAILURE_GRACE_S and not killed:
            ranks = _children(launcher.pid, recursive=True)
            killed |= {rank.pid for rank in ranks}
            kill_tree(ranks)
        stop_file = run_dir / STOP_FILE
        if stop_signal.is_set() or stop_file.exists():
            if stop_deadline is None:
                stop_since = time.monotonic()
                stop_deadline = stop_since + _grace_seconds(stop_file)
                _note(run_dir, state="stopping", stop_requested_at=time.time())
            # Ranks may still be starting: signal each one as it appears, once.
            for child in _children(launcher.pid):
                if child.pid not in signalled:
                    signalled.add(child.pid)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.send_signal(signal.SIGTERM)
            if time.monotonic() > stop_deadline:
                _kill_run(launcher)
            elif (
                signalled
                and stop_since is not None
                and not _children(launcher.pid)
                and time.monotonic() > stop_since + 5
            ):
                launcher.terminate()  # the ranks are gone but the launcher lingers
        time.sleep(POLL_S)
    kill_tree(_children(os.getpid(), recursive=True))  # nothing of the run outlives it (the launcher is reaped already)
    watch.carry_warning()  # one the run gave in its last second
    return launcher.returncode, stop_deadline is not None, killed


def post_how_it_ended(run_dir: Path, state: str, error: str | None, runtime_s: float) -> None:
    """The recipe's notify (its message, its bounded POST), of the state just recorded."""
    if not os.environ.get(NOTIFY_ENV, "").strip():
        return
    try:
        recipe_module("notifications").notify(run_dir, state, error, runtime_s)
    except Exception as exc:  # noqa: BLE001 - the run's own record is written; a notification never fails it
        print(f"supervisor: no notification sent: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _wait_for_runs_ahead(run_dir: Path, ahead: list[str], stop_signal: threading.Event) -> bool:
    """Wait while a run this one is queued after still runs; False when asked to stop first."""
    while True:
        if (run_dir / STOP_FILE).exists() or stop_signal.is_set():
            return False
        if not any(_still_runs(run_dir.parent / run_id) for run_id in ahead):
            return True
        time.sleep(QUEUE_POLL_S)


def _still_runs(other: Path) -> bool:
    """Whether another run's supervisor or launcher runs (a deleted or damaged status.json: nothing to wait for).
    A run whose end is recorded has ended, though its supervisor may still be posting how (post_how_it_ended)."""
    try:
        status = json.loads((other / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(status, dict):
        return False
    if status.get("state") in ENDED_STATES:
        return is_alive(status.get("launcher"))
    return is_alive(status.get("supervisor")) or is_alive(status.get("launcher"))


def _grace_seconds(stop_file: Path) -> float:
    try:
        return float(json.loads(stop_file.read_text())["grace_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_GRACE_S


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python supervisor.py RUN_DIR", file=sys.stderr)
        return 2
    return supervise(Path(args[0]))


if __name__ == "__main__":
    raise SystemExit(main())
