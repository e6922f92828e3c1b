"""A run on Slurm: the same run folder and RunManager API as a local run, with Slurm as its supervisor.

The run folder sits on a filesystem the nodes share. The manager writes it (queued), submits
its slurm.sbatch with `sbatch --parsable` from it, and records the job id in status.json
(`backend: slurm`, `slurm: {job_id, expected_start}`). No process of tunedeck follows the job:
every status read asks Slurm (backend/runs/slurm_jobs.py) and folds the answer in: queued with
Slurm's state and reason while it waits, running with its nodes, and once Slurm says it ended
(or has forgotten it), the end worked out from the run's own records (the `end` record, the
rank errors) and Slurm's last word, written to status.json once. So a panel restarted mid-run,
or a `tunedeck runs` on another login node, finds the run where it is.

Stop: stop.request in the shared folder (the run is "stopping"), which every rank reads at its
next step: it saves a checkpoint and exits, and the job ends by itself; after the grace period
`scancel` ends whatever is left. A job still waiting is cancelled at once.

Over SSH (launch.slurm.ssh.host): the run folder is uploaded to the login node's runs folder and
submitted there; status.json's `remote` names the link and the folder. Every status read first
pulls what changed there into the local folder (backend/runs/remote_folder.py, at most once a
second), then asks Slurm through the same link, so everything that reads the local folder (the
page, `tunedeck runs`, the charts) works unchanged. A link that fails keeps the last state with
"cannot reach HOST since HH:MM": the job trains on whatever happens to this machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from tunedeck.backend.render.launch import JOB_FILE
from tunedeck.backend.render.slurm import SLURM_FILE
from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import preflight_nodes, remote_folder, slurm_jobs, supervisor
from tunedeck.backend.runs.folder import LAUNCHER_LOG, STOP_FILE
from tunedeck.backend.runs.slurm_jobs import SlurmUnavailable
from tunedeck.backend.runs.ssh_link import SshLink, SshUnreachable

BACKEND = "slurm"
CANCEL_AFTER = ".tunedeck-cancel-after.py"  # slurm_jobs.py, copied into a remote run folder: a stop's second half
# Set by tunedeck for this machine's own processes: meaningless on the cluster, whose nodes find their own
# (launch.slurm.setup activates the environment there).
LOCAL_ONLY_ENV = ("PATH", "ACCELERATE", "TORCH_EXTENSIONS_DIR", "PYTHONPATH", "VIRTUAL_ENV")
PULL_EVERY_S = 1.0
# What a Slurm call can end in, short of a failed run: Slurm or the login node does not answer as it should.
UNAVAILABLE = (SlurmUnavailable, SshUnreachable, remote_folder.RemoteFolderError)
_pulled_at: dict[str, float] = {}  # local run folder -> when it was last pulled
ATTEMPTS_FILE = "attempts.jsonl"  # slurm.sbatch's record of each failure it classified (render/slurm.py)
# Why Slurm ended a job that did not finish, in words a user acts on.
ENDED_BY_SLURM = {
    "TIMEOUT": "Slurm ended the job at its time limit (launch.slurm.time_limit): resume it with "
    "training.resume_from_checkpoint=true and a longer limit",
    "PREEMPTED": "Slurm preempted the job for another one: turn on launch.slurm.requeue to have it start again "
    "and resume by itself",
    "NODE_FAIL": "a node of the job failed (Slurm: NODE_FAIL): resume from the last checkpoint",
    "BOOT_FAIL": "a node of the job failed to boot (Slurm: BOOT_FAIL)",
    "OUT_OF_MEMORY": "a node ran out of memory (Slurm: OUT_OF_MEMORY): raise launch.slurm.mem or lower the batch",
    "DEADLINE": "Slurm ended the job at its deadline",
    "CANCELLED": "the Slurm job was cancelled outside tunedeck (scancel)",
}


def sbatch_options(run_dir: Path, folder: str | None = None) -> list[str]:
    """What the manager adds to the script's own #SBATCH lines: its name and the run folder's launcher log."""
    return [
        f"--job-name=tunedeck-{run_dir.name}",
        f"--output={Path(folder or run_dir) / LAUNCHER_LOG}",
        "--open-mode=append",  # a requeued job adds to it
    ]


def prepare(spec, accelerate: str, changes: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command status.json records for a Slurm run, and the environment tunedeck adds to the job's."""
    changes = dict(changes)
    if not spec.launch.use_cpu:  # Slurm gives each node its GPUs, and launch.sh shares the node's cores
        for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"):
            changes.pop(name, None)
    changes["ACCELERATE"] = accelerate  # the same environment on every node (a shared filesystem)
    return ["sbatch", "--parsable", SLURM_FILE], changes


def submit(spec, run_dir: Path, inherited: dict[str, str], changes: dict[str, str]) -> str:
    """Check the nodes (launch.slurm.preflight), then submit the run folder's slurm.sbatch (over SSH when
    launch.slurm.ssh.host is set); records the job id (and Slurm's expected start) in status.json."""
    ssh = spec.launch.slurm.ssh
    via, folder, env = None, str(run_dir), {**inherited, **changes}
    if ssh.host:
        via = SshLink.from_spec(ssh)
        folder = remote_folder.upload(via, run_dir, f"{ssh.runs_dir.rstrip('/')}/{run_dir.name}")
        remote_folder.put_file(via, folder, CANCEL_AFTER, Path(slurm_jobs.__file__).read_bytes())
        supervisor.update_status(run_dir, remote={"ssh": via.record(), "folder": folder})
        env = {k: v for k, v in changes.items() if k not in LOCAL_ONLY_ENV}
    preflight_nodes.check_before_submit(spec, run_dir, env, folder, via)
    script, options = f"{folder}/{SLURM_FILE}", sbatch_options(run_dir, folder)
    start = slurm_jobs.expected_start(script, folder, options, env, via)
    job_id = slurm_jobs.submit(script, folder, options, env, via)
    try:
        supervisor.update_status(run_dir, slurm={"job_id": job_id, "expected_start": start})
    except OSError:
        slurm_jobs.cancel(job_id, via)  # a job nobody can follow must not hold the cluster
        raise
    return job_id


def remote_of(data: dict) -> tuple[SshLink, str] | None:
    """(link, folder there) of a run submitted over SSH; None for one submitted here."""
    remote = data.get("remote") or {}
    if not remote.get("ssh") or not remote.get("folder"):
        return None
    return SshLink.from_record(remote["ssh"]), str(remote["folder"])


def _pull(run_dir: Path, data: dict, force: bool = False) -> dict:
    """Bring the local mirror up to date (at most once a second unless forced); data with `remote` updated."""
    link, folder = remote_of(data) or (None, "")
    if link is None:
        return data
    now = time.monotonic()
    if not force and now - _pulled_at.get(str(run_dir), -PULL_EVERY_S) < PULL_EVERY_S:
        return data
    _pulled_at[str(run_dir)] = now
    remote = dict(data["remote"])
    try:
        remote_folder.pull(link, folder, run_dir)
    except SshUnreachable:
        if not remote.get("unreachable_since"):
            remote["unreachable_since"] = time.time()
            supervisor.update_status(run_dir, remote=remote)
        raise
    if remote.pop("unreachable_since", None):
        supervisor.update_status(run_dir, remote=remote)
    return {**data, "remote": remote}


def fetch(run_dir: Path, data: dict, checkpoint: int | None) -> Path:
    """Bring a run's final model (checkpoint None) or one checkpoint from the cluster into its local folder, where
    the after-training tools find it as in any run; its local path. Weights never come with the mirror's ticks."""
    remote = remote_of(data)
    if remote is None:
        raise remote_folder.RemoteFolderError(f"run {run_dir.name} was not submitted over SSH: its weights are here")
    link, folder = remote
    job = yaml.safe_load((run_dir / JOB_FILE).read_text(encoding="utf-8")) or {}
    output = str(job.get("output_dir") or "output")
    if Path(output).is_absolute():
        raise remote_folder.RemoteFolderError(
            f"output_dir is {output} on {link.name}, outside the run folder: copy it from there yourself"
        )
    if checkpoint is None:  # the final model: the output folder without its checkpoints
        return remote_folder.fetch(link, folder, run_dir, output, exclude=f"{output}/checkpoint-*")
    return remote_folder.fetch(link, folder, run_dir, f"{output}/checkpoint-{checkpoint}")


def unreachable_line(data: dict) -> str:
    """ "cannot reach HOST since HH:MM" while a remote run's login node does not answer; else ""."""
    remote = data.get("remote") or {}
    since = remote.get("unreachable_since")
    if not since:
        return ""
    host = (remote.get("ssh") or {}).get("host", "the login node")
    return f"cannot reach {host} since {time.strftime('%H:%M', time.localtime(since))}: the job goes on there"


def follow(run_dir: Path, data: dict) -> dict:
    """status.json's data with Slurm's present view folded in (an end is recorded once)."""
    recorded = data.get("slurm") or {}
    job_id = str(recorded.get("job_id") or "")
    if not job_id:  # written, not yet submitted (or the submission failed before the id was recorded)
        return data
    via = (remote_of(data) or (None, ""))[0]
    try:
        data = _pull(run_dir, data)
        job = slurm_jobs.job(job_id, via)
        if via is not None and (job is None or not job.live):
            data = _pull(run_dir, data, force=True)  # the end's records, before the end is decided
    except SshUnreachable:
        # Never a failed run: the last state holds, with the line that says why it may be stale.
        current = run_folder.read_status_quietly(run_dir) or data  # _pull recorded since when
        return {**data, "remote": current.get("remote"), "slurm": {**recorded, "reason": unreachable_line(current)}}
    except SlurmUnavailable as exc:
        # Nothing to decide on: keep the recorded state and say why it may be stale.
        return {**data, "slurm": {**recorded, "reason": f"Slurm does not answer: {exc}"}}
    attempts = _attempts(run_dir)
    data = {**data, "attempts": attempts} if attempts else data
    if job is not None and job.live:
        return _live(run_dir, data, recorded, job)
    return _ended(run_dir, data, recorded, job)


def _attempts(run_dir: Path) -> list[dict]:
    """attempts.jsonl: the job's failures as slurm.sbatch classified them, and whether it was requeued for each."""
    try:
        lines = (run_dir / ATTEMPTS_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return supervisor.json_objects(lines)


def _live(run_dir: Path, data: dict, recorded: dict, job: slurm_jobs.SlurmJob) -> dict:
    slurm = {**recorded, "state": job.state, "reason": job.reason, "nodes": job.nodes}
    if job.waiting:
        state = "queued"
    else:
        state = "stopping" if (run_dir / STOP_FILE).exists() else "running"
        if data["state"] == "queued":  # first seen running: recorded, so a reader without Slurm sees it too
            supervisor.update_status(run_dir, state="running", started_at=time.time(), slurm=slurm)
            data = {**data, "started_at": time.time()}
    return {**data, "state": state, "slurm": slurm}


def _ended(run_dir: Path, data: dict, recorded: dict, job: slurm_jobs.SlurmJob | None) -> dict:
    stop_requested = (run_dir / STOP_FILE).exists()
    state, error = supervisor.final_state(run_dir, job.exit_code if job else None, stop_requested)
    if job is not None and state != "finished" and not stop_requested and job.state in ENDED_BY_SLURM:
        said = ENDED_BY_SLURM[job.state]
        if state == "failed":
            error = f"{said}\n{error}" if error else said
        else:
            error = said
    if state == "stopped" and _stopped_by_time_limit(run_dir):
        error = ENDED_BY_SLURM["TIMEOUT"].replace("ended the job at", "stopped the job before")
    elif state == "stopped" and not stop_requested and not error:
        error = (
            "Slurm signalled the job to stop (its time limit was near, or an scancel): its last checkpoint is in "
            "output_dir; resume with training.resume_from_checkpoint=true"
        )
    nodes = (job.nodes if job else []) or recorded.get("nodes") or []
    slurm = {**recorded, "state": job.state if job else "gone", "reason": job.reason if job else "", "nodes": nodes}
    ended = {
        "state": state,
        "ended_at": data.get("ended_at") or run_folder.last_written(run_dir),
        "error": error,
        "exit_code": job.exit_code if job else None,
        "slurm": slurm,
    }
    last = (data.get("attempts") or [{}])[-1]
    if state == "failed" and last.get("end") and not last.get("retried"):  # what slurm.sbatch made of it
        ended["failure"] = {
            "kind": last["end"],
            "reason": last.get("reason", ""),
            "not_retried": last.get("not_retried"),
        }
    problem = supervisor.record_end(run_dir, tries=2, retry_s=0, **ended)
    if problem:
        ended["error"] = f"{error or ''}\n(this end is not recorded in status.json: {problem})".strip()
    return {**data, **ended}


def _stopped_by_time_limit(run_dir: Path) -> bool:
    """slurm.sbatch writes the stop request itself when the time limit nears ("by": "time_limit")."""
    try:
        return '"time_limit"' in (run_dir / STOP_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def stop(run_dir: Path, data: dict, grace_s: float, env: dict[str, str] | None = None) -> None:
    """Ask the job to stop: stop.request for its ranks now, scancel after grace_s (at once when it still waits)."""
    job_id = str((data.get("slurm") or {}).get("job_id") or "")
    run_folder.write_stop_request(run_dir, grace_s)  # before the signal: the job script must not pass a second one
    link, folder = remote_of(data) or (None, "")
    if link is not None:  # the ranks read the request in the folder on the cluster
        remote_folder.put_file(link, folder, STOP_FILE, (run_dir / STOP_FILE).read_bytes())
    if not job_id:
        return
    job = slurm_jobs.job(job_id, link)
    if job is None or not job.live:
        return
    if job.waiting:
        slurm_jobs.cancel(job_id, link)  # nothing started, nothing to save
        return
    # No signal: every rank reads stop.request at its next step. Measured on the local cluster:
    # `scancel --signal=TERM --full` also reaches srun in the job script, which answers "forcing job
    # termination" and ends the job at once; a TERM to the steps alone reaches torch's elastic agent,
    # which kills its ranks 30 s later, saved or not.
    if link is None:
        slurm_jobs.start_cancel_after(job_id, grace_s, env)
        return
    # On the login node, detached there: the cancel happens whatever becomes of this machine or the link.
    script = 'nohup python3 "$1" cancel-after "$2" "$3" >/dev/null 2>&1 &'
    link.run(["sh", "-c", script, "sh", f"{folder}/{CANCEL_AFTER}", job_id, str(float(grace_s))])
