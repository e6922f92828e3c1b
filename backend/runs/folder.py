"""The run-folder contract: what a run folder holds, and the records its files carry.

A run is a folder; the disk is the message bus between the trainer (backend/recipe/, shipped in the bundle), the
run's supervisor (backend/runs/supervisor.py) and the readers (the run manager, the CLI, the panel). The writers run
without tunedeck; the file names they share are the recipe's (backend/recipe/records.py), which this module imports,
and tests/runs/test_run_folder_contract.py checks the records' keys against backend/runs/records.py.

    runs/<run-id>/
      job.yaml ...        the job's bundle (backend/render), as launched
      status.json         state, processes, times, exit code, error: written "queued" by the manager, then by the
                          run's supervisor (for a run on a cluster, by whatever follows the scheduler's job instead)
      stop.request        the manager's request to stop: {"grace_s", "time"}
      metrics.jsonl       rank 0's records: a start (what the run got), a log per logging step (train or eval), an end
      errors.jsonl        one error record per failed rank
      logs/rank<N>.log    each rank's stdout and stderr; logs/launcher.log, logs/supervisor.log
      output/             checkpoints (under .incomplete/ until renamed) and the final model, for a relative output_dir
      .disk-reserve       room for the final status.json when training fills the disk
      notes.json          the run's name and notes (the panel, `tunedeck runs note`): written by readers, never the run

The records metrics.jsonl and errors.jsonl carry, and their readers, are in backend/runs/records.py.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import NotRequired, TypedDict  # pydantic needs this TypedDict on Python < 3.12

from tunedeck.backend.recipe.records import ERRORS_FILE, LOGS_DIR, METRICS_FILE, STOP_FILE  # the recipe's names

RUN_ID_PATTERN = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")  # a run folder's name: time and random hex
STATUS_FILE = "status.json"
LAUNCHER_LOG = f"{LOGS_DIR}/launcher.log"
SUPERVISOR_LOG = f"{LOGS_DIR}/supervisor.log"
RESERVE_FILE = ".disk-reserve"
RESERVE_BYTES = 64 * 1024  # a status.json with a 20-line error is under 8 KiB
NOTES_FILE = "notes.json"


def rank_log(rank: int) -> str:
    return f"{LOGS_DIR}/rank{rank}.log"


State = Literal["queued", "running", "stopping", "finished", "failed", "stopped"]
STATES: tuple[str, ...] = get_args(State)
ACTIVE_STATES = ("queued", "running", "stopping")


# ---------------------------------------------------------------- status.json and stop.request


class ProcessIdentity(BaseModel):
    pid: int
    create_time: float  # a pid alone may have been reused by an unrelated process
    since_boot: float | None = None  # its start in seconds after boot: unlike create_time, not moved by clock steps
    boot_id: str | None = None  # Linux's id of the boot it was recorded in
    pgid: int | None = None  # the launcher's process group


Timestamp = Annotated[float, Field(ge=0, lt=1e11)]  # seconds since the epoch that time.localtime shows (not 1e300)


class Progress(TypedDict):
    """progress.json: rank 0's last finished training step, micro-batch and forward pass (train.py's write_progress)."""

    step: int
    micro: int  # micro-batches done: a step of many gradient accumulation steps makes progress as they come
    forwards: int  # forward passes done in the step (GRPO writing its answers, a token each): progress too
    time: Timestamp
    saving: bool  # writing a checkpoint, or training ended and the final model is saved: no stall, however long
    warning: NotRequired[str]  # the run's latest warning (a GRPO reward that scored no answer of a step)


class StallSettings(TypedDict):
    after_s: float  # no training step for this long (0: never), and for 3x the longest gap seen


def stall_settings(launch) -> StallSettings:  # what the supervisor reads of a job's launch.stall_minutes
    return StallSettings(after_s=launch.stall_minutes * 60)


class RestartSettings(TypedDict):
    max: int  # new attempts after failures a new attempt can cure (launch.max_restarts; 0: none)
    backoff_s: float  # the wait before the first, doubled for each one after it (launch.restart_backoff_s)


def restart_settings(launch) -> RestartSettings:  # what the supervisor reads of a job's launch.max_restarts
    return RestartSettings(max=launch.max_restarts, backoff_s=launch.restart_backoff_s)


class Attempt(TypedDict, total=False):
    """An attempt of a run that was started again: ended by a roll-back (training.health) or by a failure that a new
    attempt can cure (backend/recipe/failures.py); the last attempt of such a run is listed too."""

    attempt: int  # 1, 2, ...
    started_at: float
    ended_at: float
    end: str  # "rolled back", or the failure's class: comm, unknown, oom, data, config, ...
    reason: str  # what was seen
    step: int | None  # the last step rank 0 finished in it
    retried: bool  # a new attempt followed (a failure's)


class Failure(TypedDict):
    kind: str  # the class of the failure that ended the run (backend/recipe/failures.py)
    reason: str
    not_retried: str  # why no new attempt was made


class Restarting(TypedDict):
    at: float  # when the next attempt starts (epoch seconds)
    after: str  # the class of the failure it follows


class Stalled(TypedDict):
    step: int  # the last step rank 0 finished
    since: float  # when it finished it (epoch seconds)
    limit_s: float  # the gap that counted as stalled
    phase: NotRequired[str]  # before training: the startup phase that stalls (importing the reward functions)


class StatusFile(BaseModel):
    """status.json: written by the manager (queued) and the supervisor; the readers trust nothing else."""

    model_config = ConfigDict(extra="allow")
    run_id: str | None = None
    state: State
    title: str = ""
    created_at: Timestamp | None = None
    # time.monotonic() when queued, and its boot: one clock for that boot's processes, not moved by wall-clock steps
    created_monotonic: float | None = None
    created_in_boot: str | None = None
    started_at: Timestamp | None = None
    stop_requested_at: Timestamp | None = None
    ended_at: Timestamp | None = None
    exit_code: int | None = None
    error: str | None = None  # on failure: the error lines of the rank that failed first
    gpu_ids: list[int] | None = None
    argv: list[str] | None = None  # what the supervisor starts: `accelerate launch ...`
    env: dict[str, str] | None = None  # what tunedeck set on top of its own environment
    supervisor: ProcessIdentity | None = None
    launcher: ProcessIdentity | None = None
    waits_for: list[str] | None = None  # queued after these runs: its supervisor starts it when they have ended
    stall: StallSettings | None = None  # when the supervisor calls the run stalled (launch.stall_minutes)
    stalled: Stalled | None = None  # the supervisor's finding while no step comes; None again once one does
    warning: str | None = None  # the run's own latest warning, from progress.json (the supervisor carries it)
    restarts: RestartSettings | None = None  # when the supervisor starts a failed run again (launch.max_restarts)
    attempts: list[Attempt] | None = None  # the attempts of a run started again (the supervisor's)
    restarting: Restarting | None = None  # between two attempts: when the next one starts
    failure: Failure | None = None  # a failed run: the class of its failure, and why it was not started again
    # A Slurm run reached over SSH (launch.slurm.ssh): {"ssh": the link, "folder": the run folder there,
    # "unreachable_since": while the login node does not answer}; the local folder is its mirror.
    remote: dict | None = None


class DamagedStatus(Exception):
    """status.json exists but cannot be trusted; the message says why."""


def read_status_file(run_dir: Path) -> dict:
    """status.json with the types the readers rely on. FileNotFoundError when absent, DamagedStatus when wrong."""
    try:
        raw = json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise DamagedStatus(f"{STATUS_FILE} cannot be read ({exc})") from None
    if not isinstance(raw, dict):
        raise DamagedStatus(f"{STATUS_FILE} holds a JSON {type(raw).__name__}, not an object")
    try:
        return StatusFile.model_validate(raw).model_dump()
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors()[:3])
        raise DamagedStatus(f"{STATUS_FILE} is not a run status ({wrong})") from None


def read_status_quietly(run_dir: Path) -> dict:
    """status.json as read_status_file gives it, or {} when it is missing or damaged (for a reader that goes on)."""
    try:
        return read_status_file(run_dir)
    except (OSError, DamagedStatus):
        return {}


def queued_status(
    run_id: str,
    title: str,
    argv: list[str],
    gpu_ids: list[int] | None,
    env: dict,
    waits_for=(),
    launch=None,
) -> dict:
    """The status.json of a run folder about to be handed to its supervisor; with the job's `launch` section, the
    supervisor's stall watch and restarts (a run on this machine: a Slurm job has its own, slurm.sbatch)."""
    status = StatusFile(
        run_id=run_id,
        state="queued",
        title=title,
        created_at=time.time(),
        started_at=None,
        ended_at=None,
        exit_code=None,
        error=None,
        gpu_ids=gpu_ids,
        argv=argv,
        env=env,
        waits_for=list(waits_for),
        stall=stall_settings(launch) if launch else None,
        restarts=restart_settings(launch) if launch else None,
    )
    return status.model_dump(exclude_unset=True)


class StopRequest(TypedDict):
    grace_s: float  # seconds the ranks get to save and exit before SIGKILL
    time: float


def write_stop_request(run_dir: Path, grace_s: float) -> None:
    request = StopRequest(grace_s=grace_s, time=time.time())
    (run_dir / STOP_FILE).write_text(json.dumps(request) + "\n")


def write_reserve(run_dir: Path) -> None:
    """Claim RESERVE_BYTES of the run folder's disk (random bytes: a compressing filesystem cannot shrink them)."""
    (run_dir / RESERVE_FILE).write_bytes(os.urandom(RESERVE_BYTES))


def last_written(run_dir: Path) -> float:
    """When the run last wrote anything: the end time of a run whose supervisor could not record it."""
    paths = [run_dir / name for name in (METRICS_FILE, ERRORS_FILE, LAUNCHER_LOG)]
    return max((path.stat().st_mtime for path in paths if path.is_file()), default=time.time())
