"""Slurm's client commands, as the run manager uses them: submit, ask, signal, cancel.

    python backend/runs/slurm_jobs.py cancel-after JOB_ID GRACE_S   (the second half of a stop; stdlib only)

Every command is an argv list (never a shell string) with a timeout: a client without a
reachable controller retries for a minute, and a status read must not hang the panel. With
`via` (an SshLink: launch.slurm.ssh) the same argv runs on the cluster's login node, the
environment's changes and the working folder given to `env` there; an SshUnreachable from the
link passes through untouched, so that callers tell "cannot reach" from "Slurm does not answer".
What a job is doing comes from `squeue` while it is queued or running, then from `scontrol
show job` while Slurm remembers it (MinJobAge, 5 minutes by default); never from `sacct`,
which fails on clusters without accounting (slurmdbd). After that, the run folder's own
records tell how it ended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol


class SshLink(Protocol):
    """What this module needs of backend/runs/ssh_link.py's link (not imported: on the cluster, as cancel-after,
    this file runs without tunedeck)."""

    @property
    def name(self) -> str: ...

    def run(
        self, remote: list[str], *, data: bytes | None = None, timeout: float = ...
    ) -> subprocess.CompletedProcess: ...


TIMEOUT_S = 15.0
CACHE_S = 2.0  # the panel polls every run often; Slurm's answer is fresh enough for this long
# Job states (squeue's %T, scontrol's JobState) grouped by what they mean for a run.
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}


class SlurmUnavailable(Exception):
    """A Slurm command could not run or its controller did not answer; the message says which."""


@dataclass
class SlurmJob:
    job_id: str
    state: str  # Slurm's own word: PENDING, RUNNING, COMPLETED, TIMEOUT ...
    reason: str = ""  # why it waits (Priority, Resources ...) or why it ended
    nodes: list[str] = field(default_factory=list)
    exit_code: int | None = None  # the batch script's, once it ended
    restarts: int = 0  # how often Slurm requeued it

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def live(self) -> bool:
        return self.state in WAITING or self.state in RUNNING


def run(
    argv: list[str],
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
    cwd: str | None = None,
    via: SshLink | None = None,
) -> subprocess.CompletedProcess:
    if via is not None:
        return _run_there(via, argv, env, timeout, cwd)
    try:
        return subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise SlurmUnavailable(f"`{argv[0]}` is not installed here: run tunedeck on a machine of the cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"`{' '.join(argv[:2])}` did not answer within {timeout:.0f} s") from None


def _run_there(
    via: SshLink, argv: list[str], env: dict[str, str] | None, timeout: float, cwd: str | None
) -> subprocess.CompletedProcess:
    """argv on the login node: `env [--chdir=cwd] NAME=value... argv`, every word data for the remote shell."""
    remote = ["env", *([f"--chdir={cwd}"] if cwd else []), *[f"{k}={v}" for k, v in (env or {}).items()], *argv]
    done = via.run(remote, timeout=timeout + 15)  # the link's round trip on top of the command's own time
    if done.returncode == 127 and b"No such file" in done.stderr:
        raise SlurmUnavailable(f"`{argv[0]}` is not installed on {via.name}: is it the cluster's login node?")
    return subprocess.CompletedProcess(
        argv, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    )


def _failure(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit code {done.returncode}"


# ---------------------------------------------------------------- submit


def submit(script: str, folder: str, extra: list[str], env: dict[str, str], via: SshLink | None = None) -> str:
    """`sbatch --parsable` from the folder; the job id. SlurmUnavailable with sbatch's own words when refused."""
    # From the folder: the script finds its bundle through SLURM_SUBMIT_DIR, sbatch's working folder.
    done = run(["sbatch", "--parsable", f"--chdir={folder}", *extra, script], env=env, cwd=folder, via=via)
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode or not job_id.isdigit():
        raise SlurmUnavailable(f"sbatch refused the job: {_failure(done)}")
    return job_id


def expected_start(
    script: str, folder: str, extra: list[str], env: dict[str, str], via: SshLink | None = None
) -> str | None:
    """When Slurm expects a job like this one to start (`sbatch --test-only`: submits nothing)."""
    try:
        done = run(["sbatch", "--test-only", f"--chdir={folder}", *extra, script], env=env, cwd=folder, via=via)
    except SlurmUnavailable:
        return None
    found = re.search(r"to start at (\S+)", done.stderr + done.stdout)
    return found.group(1) if found else None


# ---------------------------------------------------------------- ask

_cache: dict[tuple[str, str], tuple[float, SlurmJob | None]] = {}  # (login node or "", job id) -> answer


def job(job_id: str, via: SshLink | None = None) -> SlurmJob | None:
    """The job as Slurm sees it now; None once Slurm has forgotten it. SlurmUnavailable when it cannot say."""
    key = (via.name if via else "", job_id)
    cached = _cache.get(key)
    if cached and time.monotonic() - cached[0] < CACHE_S:
        return cached[1]
    found = _queued(job_id, via) or _remembered(job_id, via)
    _cache[key] = (time.monotonic(), found)
    return found


def forget(job_id: str, via: SshLink | None = None) -> None:
    """Drop the cached answer (after a stop or a submit, the next read asks Slurm again)."""
    _cache.pop((via.name if via else "", job_id), None)


def _queued(job_id: str, via: SshLink | None = None) -> SlurmJob | None:
    done = run(["squeue", "--noheader", "--jobs", job_id, "--format", "%i|%T|%r|%N"], via=via)
    if done.returncode:
        if "Invalid job id" in done.stderr:  # ended and already purged from the queue
            return None
        raise SlurmUnavailable(f"squeue: {_failure(done)}")
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            reason = "" if parts[2] in ("None", "(null)") else parts[2]
            return SlurmJob(job_id, parts[1], reason, expand_nodes(parts[3]))
    return None


def _remembered(job_id: str, via: SshLink | None = None) -> SlurmJob | None:
    done = run(["scontrol", "--oneliner", "show", "job", job_id], via=via)
    if done.returncode:
        if "Invalid job id" in done.stderr:
            return None
        raise SlurmUnavailable(f"scontrol: {_failure(done)}")
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    if fields.get("JobId") != job_id:
        return None
    code = fields.get("ExitCode", "")
    exit_code = int(code.split(":")[0]) if code.split(":")[0].isdigit() else None
    reason = fields.get("Reason", "")
    return SlurmJob(
        job_id,
        fields.get("JobState", "UNKNOWN"),
        "" if reason in ("None", "(null)") else reason,
        expand_nodes(fields.get("NodeList", "")),
        exit_code,
        int(fields.get("Restarts", "0") or 0),
    )


def expand_nodes(node_list: str) -> list[str]:
    """Slurm's compact node list (n[0-1],gpu07) as names, the way `scontrol show hostnames` writes them."""
    if not node_list or node_list in ("(null)", "None") or node_list.startswith("("):
        return []
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", node_list):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}")
    return names


# ---------------------------------------------------------------- signal and cancel


def cancel(job_id: str, via: SshLink | None = None) -> None:
    forget(job_id, via)
    done = run(["scancel", job_id], via=via)
    if done.returncode and "already completing or completed" not in done.stderr:
        raise SlurmUnavailable(f"scancel: {_failure(done)}")


def cancel_after(job_id: str, grace_s: float, poll_s: float = 1.0) -> None:
    """Wait for the job to end by itself for grace_s seconds, then cancel it (what is left is killed)."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            found = _queued(job_id)
        except SlurmUnavailable:
            found = SlurmJob(job_id, "UNKNOWN")
        if found is None or found.state not in RUNNING | WAITING:
            return
        time.sleep(poll_s)
    cancel(job_id)


def start_cancel_after(job_id: str, grace_s: float, env: dict[str, str] | None = None) -> None:
    """cancel_after in a detached process of its own: a stop returns at once and outlives its caller."""
    subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "cancel-after", job_id, str(grace_s)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "cancel-after" and sys.argv[2].isdigit():
        cancel_after(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit("usage: slurm_jobs.py cancel-after JOB_ID GRACE_S")
