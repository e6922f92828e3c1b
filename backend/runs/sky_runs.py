"""A run as a SkyPilot managed job (launch.backend=skypilot): Kubernetes or a cloud, through `sky`.

The manager writes the run folder (queued, with sky.yaml), and submit() checks that SkyPilot is installed and has
infra enabled (else Start is refused, naming the field and `sky check`, and the folder is removed), then starts a
detached launcher (sky_jobs.py launch, with SkyPilot's python) that uploads the folder as the task's workdir and
writes the managed job's id into sky_launch.json: uploading and, on a first launch, starting SkyPilot's jobs
controller take minutes, which no Start should wait for. Every status read asks SkyPilot (sky_jobs.py queue) and
folds its state in, a line for each (STATES): a job SkyPilot is still provisioning is queued, "provisioning ...",
never failed (the failure to avoid: transformerlab-app#1446, #1896), and an end is recorded once. The job's output
(`sky jobs logs --no-follow`) is copied into logs/launcher.log at most every LOGS_EVERY_S, and once at its end.

What stays on the nodes: metrics.jsonl and the checkpoints are written in the task's workdir there, so the run view
shows SkyPilot's state and the job's log, not the loss curve; output_dir on a bucket the nodes mount keeps the
weights. Stop cancels the job (`sky jobs cancel`): no stop request reaches ranks that share no folder with us.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from tunedeck.backend.render.sky import SKY_FILE
from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.folder import LAUNCHER_LOG, STOP_FILE
from tunedeck.backend.runs.preflight import refusal
from tunedeck.backend.runs.status import RunError
from tunedeck.backend.spec.problem import error

BACKEND = "skypilot"
SKY_JOBS = str(Path(__file__).with_name("sky_jobs.py"))  # run with SkyPilot's python, never imported here
LAUNCH_FILE = "sky_launch.json"  # the detached launcher's answer: {"job_id": N} or {"error": ...}
SKY_PYTHON_ENV = "TUNEDECK_SKY_PYTHON"  # the python of SkyPilot's environment, when `sky` is not on PATH
LOGS_EVERY_S = 30.0
ASK_EVERY_S = 10.0
_asked: dict[str, tuple[float, dict]] = {}  # run folder -> (when SkyPilot was last asked, what follow made of it)
CALL_TIMEOUT_S = 120.0
INFRA = "launch.skypilot.infra"
CHECK = "run `sky check` to see which infra SkyPilot can use and what each needs"
# SkyPilot's managed job states (`sky jobs queue --help`) -> tunedeck's state, and what a person is told.
STATES = {
    "PENDING": ("queued", "provisioning: waiting for a slot on SkyPilot's jobs controller"),
    "SUBMITTED": ("queued", "provisioning: submitted to SkyPilot's jobs controller"),
    "STARTING": ("queued", "provisioning: SkyPilot is finding and starting the nodes"),
    "RUNNING": ("running", "running"),
    "WINDING_DOWN": ("running", "winding down: the job is done, SkyPilot is collecting its outputs"),
    "RECOVERING": ("running", "recovering: the nodes were preempted or failed; SkyPilot is starting new ones"),
    "CANCELLING": ("stopping", "cancelling"),
    "SUCCEEDED": ("finished", "succeeded"),
    "CANCELLED": ("stopped", "cancelled (sky jobs cancel)"),
    "FAILED": ("failed", "the training command failed on a node: its log is in logs/launcher.log"),
    "FAILED_SETUP": ("failed", "setup failed on a node (pip install -r requirements.txt): see logs/launcher.log"),
    "FAILED_PRECHECKS": ("failed", "SkyPilot refused the task before launching it (its resources or infra)"),
    "FAILED_NO_RESOURCE": (
        "failed",
        "no enabled infra had the resources: try other launch.skypilot.accelerators, launch.skypilot.infra or use_spot",
    ),
    "FAILED_CONTROLLER": ("failed", "SkyPilot's jobs controller failed: `sky jobs logs --controller ID` says why"),
}


class SkyUnavailable(Exception):
    """SkyPilot did not answer as it should (never a failed run: the last state holds)."""


UNAVAILABLE = (SkyUnavailable,)


def sky_python() -> str:
    """The python of SkyPilot's environment: $TUNEDECK_SKY_PYTHON, else the interpreter of `sky` on PATH."""
    if os.environ.get(SKY_PYTHON_ENV):
        return os.environ[SKY_PYTHON_ENV]
    sky = shutil.which("sky")
    if sky is None:
        raise SkyUnavailable(
            "`sky` is not on PATH: install SkyPilot (pip install skypilot, in an environment of its own), put its "
            f"`sky` on PATH or set {SKY_PYTHON_ENV} to its python, then {CHECK}"
        )
    first = Path(sky).read_bytes()[:512].split(b"\n", 1)[0].decode(errors="replace")
    return first[2:].strip() if first.startswith("#!") and " " not in first[2:].strip() else "python3"


def call(verb: str, *args: str, timeout: float = CALL_TIMEOUT_S) -> dict:
    """One verb of sky_jobs.py with SkyPilot's python; its JSON answer, or SkyUnavailable with SkyPilot's words."""
    argv = [sky_python(), SKY_JOBS, verb, *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise SkyUnavailable(f"SkyPilot does not answer ({verb}): {exc}") from None
    if "error" in answer or done.returncode:
        raise SkyUnavailable(answer.get("error") or done.stderr.strip()[-500:] or f"{verb} exited {done.returncode}")
    return answer


def check_before_submit(spec, run_dir: Path) -> None:
    """Start's refusal when SkyPilot is missing or has no infra for the job, naming the field and the fix; the run
    folder is then removed: nothing was submitted."""
    problems = []
    try:
        enabled = call("check")["enabled"]
    except SkyUnavailable as exc:
        problems.append(error("launch.backend", f"SkyPilot cannot submit the job: {exc}"))
    else:
        infra = spec.launch.skypilot.infra
        cloud = (infra or "").split("/", 1)[0].lower().replace("k8s", "kubernetes")
        if not enabled:
            problems.append(error(INFRA, f"SkyPilot has no infra enabled: {CHECK}"))
        elif cloud and cloud != "*" and cloud not in enabled:
            problems.append(
                error(INFRA, f"{infra!r} is not enabled in SkyPilot (enabled: {', '.join(enabled)}): {CHECK}")
            )
    if problems:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise refusal(problems, "SkyPilot cannot run the job")


def job_name(spec, run_dir: Path) -> str:
    return spec.launch.skypilot.name or f"tunedeck-{run_dir.name}"


def prepare(spec, accelerate: str, changes: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command status.json records (the launcher runs its SDK equivalent), and the environment: the nodes'
    own (launch.env reaches them through launch.sh), so nothing of this machine's."""
    return ["sky", "jobs", "launch", "-y", SKY_FILE], {}


def submit(spec, run_dir: Path, inherited: dict[str, str], changes: dict[str, str]) -> None:
    """Check SkyPilot, then start the detached launcher; the job's id arrives in sky_launch.json (follow)."""
    check_before_submit(spec, run_dir)
    name = job_name(spec, run_dir)
    supervisor.update_status(run_dir, skypilot={"name": name, "state": "", "reason": "submitting"})
    log_path = run_dir / LAUNCHER_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sky_python(), SKY_JOBS, "launch", str(run_dir), name, str(run_dir / LAUNCH_FILE)]
    with open(log_path, "ab") as log:
        subprocess.Popen(  # argv, no shell
            argv,
            cwd=run_dir,
            env=inherited,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the submission goes on whatever becomes of the panel
        )


def _launched(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / LAUNCH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def follow(run_dir: Path, data: dict) -> dict:
    """status.json's data with SkyPilot's present view folded in (an end is recorded once). SkyPilot is asked at
    most every ASK_EVERY_S per run: each question starts SkyPilot's python (seconds), and the page and `tunedeck
    runs` read a run's status far more often; a stop request asks at once."""
    now, last = time.monotonic(), _asked.get(str(run_dir))
    if last is not None and now - last[0] < ASK_EVERY_S and not (run_dir / STOP_FILE).exists():
        return {**data, **last[1]}
    followed = _follow(run_dir, data)
    _asked[str(run_dir)] = (now, {key: followed.get(key) for key in ("state", "skypilot")})
    return followed


def _follow(run_dir: Path, data: dict) -> dict:
    recorded = dict(data.get("skypilot") or {})
    if not recorded.get("job_id"):
        launched = _launched(run_dir)
        if launched.get("error"):
            return _end(run_dir, data, recorded, "failed", f"SkyPilot did not take the job: {launched['error']}")
        if not launched.get("job_id"):
            line = "provisioning: uploading the bundle to SkyPilot (a first launch also starts its jobs controller)"
            return {**data, "state": "queued", "skypilot": {**recorded, "reason": line}}
        recorded["job_id"] = launched["job_id"]
        supervisor.update_status(run_dir, skypilot=recorded)
    job_id = str(recorded["job_id"])
    try:
        job = call("queue", job_id)["job"]
        if (run_dir / STOP_FILE).exists() and job and STATES.get(job["status"], ("",))[0] in ("queued", "running"):
            call("cancel", job_id)  # a stop asked before the job's id was known
    except SkyUnavailable as exc:
        return {**data, "skypilot": {**recorded, "reason": f"SkyPilot does not answer: {exc}"}}
    if job is None:
        return _end(run_dir, data, recorded, "failed", f"SkyPilot no longer knows managed job {job_id}")
    status = str(job["status"])
    state, line = STATES.get(status, ("queued", status.lower()))
    said = " · ".join(str(job[k]) for k in ("details", "failure_reason") if job.get(k))
    recorded.update(state=status, reason=f"{line}: {said}" if said else line, infra=job.get("infra"))
    if state in ("queued", "running", "stopping"):
        _copy_logs(run_dir, job_id)
        if state == "running" and data["state"] == "queued":
            supervisor.update_status(run_dir, state="running", started_at=time.time(), skypilot=recorded)
        return {**data, "state": state, "skypilot": recorded}
    _copy_logs(run_dir, job_id, force=True)
    return _end(run_dir, data, recorded, state, None if state in ("finished", "stopped") else recorded["reason"])


def _end(run_dir: Path, data: dict, recorded: dict, state: str, error_line: str | None) -> dict:
    ended = {"state": state, "ended_at": data.get("ended_at") or time.time(), "error": error_line}
    problem = supervisor.record_end(run_dir, tries=2, retry_s=0, skypilot=recorded, **ended)
    if problem:
        ended["error"] = f"{error_line or ''}\n(this end is not recorded in status.json: {problem})".strip()
    return {**data, **ended, "skypilot": recorded}


_logs_at: dict[str, float] = {}  # run folder -> when its log was last copied


def _copy_logs(run_dir: Path, job_id: str, force: bool = False) -> None:
    """`sky jobs logs --no-follow ID` into logs/launcher.log (whole: SkyPilot has no offset to read from)."""
    now = time.monotonic()
    if not force and now - _logs_at.get(str(run_dir), -LOGS_EVERY_S) < LOGS_EVERY_S:
        return
    _logs_at[str(run_dir)] = now
    sky = str(Path(sky_python()).with_name("sky"))
    try:
        done = subprocess.run([sky, "jobs", "logs", "--no-follow", job_id], capture_output=True, timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return  # the next tick tries again
    if done.returncode == 0 and done.stdout:
        target = run_dir / LAUNCHER_LOG
        partial = target.with_name(f".{target.name}.part")
        partial.write_bytes(done.stdout)
        os.replace(partial, target)


def stop(run_dir: Path, data: dict, grace_s: float) -> None:
    """Cancel the managed job (its nodes share no folder with us for a stop request); a job whose id is not known
    yet is cancelled by follow() as soon as it is."""
    run_folder.write_stop_request(run_dir, grace_s)
    job_id = str((data.get("skypilot") or {}).get("job_id") or _launched(run_dir).get("job_id") or "")
    if job_id:
        call("cancel", job_id)


def fetch(run_dir: Path, data: dict, checkpoint: int | None) -> Path:
    raise RunError(
        f"run {run_dir.name} trained on SkyPilot's nodes: its weights are in output_dir there (set output_dir to a "
        "bucket the nodes mount to keep them)"
    )
