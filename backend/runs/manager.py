"""Run manager: start a job as a run folder, watch it, stop it, re-attach, list past runs.

A run is a folder under the runs directory (its layout and records: backend/runs/folder.py):
the job's bundle (job.yaml, accelerate_config.yaml, ds_config.json, training_args.yaml,
launch.sh, train_sft.py), status.json, metrics.jsonl, logs/. The disk is the message bus: the
manager keeps no state that a restart could lose. Where the run's processes run is its
backend's (backend/runs/backends.py): on this machine a small supervisor process
(backend/runs/supervisor.py, started by local_runs.py) in its own session starts
`accelerate launch` in its own process group, carries out stops and records the exit
code; on Slurm (slurm_runs.py) the scheduler does. The manager validates, writes the run
folder, and starts, follows and stops each run through its backend.

Bad state never breaks the tool: a damaged or foreign run folder is one run in state
"damaged" (backend/runs/status.py), a live run whose folder was deleted is still listed and
can be stopped, a run folder is written whole under a hidden name and renamed (a full disk
leaves nothing behind), and an end the supervisor could not record is worked out from the
run's own records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tunedeck.backend.runs import backends, supervisor
from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import status as run_status
from tunedeck.backend.runs.folder import (
    ACTIVE_STATES,
    RUN_ID_PATTERN,
    STATUS_FILE,
    DamagedStatus,
    read_status_file,
)
from tunedeck.backend.runs.job_file import UnreadableJob, read_job
from tunedeck.backend.runs.launch import accelerate_command, inherited_env, launch_args, rank_env
from tunedeck.backend.runs.status import RunError, RunStatus  # RunError: its home, which preflight imports too
from tunedeck.backend.runs.summary import run_title
from tunedeck.backend.runs.supervisor import is_alive, write_status
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import refuses_start

DEFAULT_GRACE_S = 60.0


class RunManager:
    def __init__(self, runs_dir: Path | str = "runs"):
        self.runs_dir = Path(runs_dir).resolve()
        self._supervisors: dict[str, subprocess.Popen] = {}
        self._stop_requested: set[str] = set()  # by this manager: a run that vanishes after it ended "stopped"

    # ------------------------------------------------------------ start

    def start(self, spec, queue: bool = False) -> str:
        """Validate, check the inputs, write the run folder and launch it; returns the run id. Raises RunError.

        `queue`: start it after the live runs that hold its GPUs (a CPU run: after the other CPU runs) have
        ended; its supervisor waits for them (a Slurm run queues in Slurm, as always)."""
        from tunedeck.backend.runs import preflight
        from tunedeck.backend.validate import validate

        errors = [p for p in validate(spec) if p.level == "error"]
        if errors:
            raise preflight.refusal(errors, "the job has errors")
        accelerate = accelerate_command()
        if accelerate is None:
            raise preflight.refusal(preflight.machine_problems(self.runs_dir))
        self.check_folder(create=True)
        preflight.check_resume(spec, self.runs_dir, self.list_runs())
        self._ensure_demo_if_used(spec)
        # Warnings other than this machine's refusals (sbatch missing): shown by the CLI and the page.
        problems = refuses_start(preflight.preflight(spec, self.runs_dir))
        if problems:
            raise preflight.refusal(problems, "the job's inputs have problems")
        backend = backends.named(spec.launch.backend)
        if backend.prepare is not None:
            return self._submit(spec, accelerate, backend)
        try:
            with self._start_lock():  # two starts at once must not both claim the same GPUs
                runs = self.list_runs()
                ahead = preflight.runs_ahead(spec, runs) if queue else []
                gpus = preflight.claim_gpus(spec, runs, ahead)
                env_changes = rank_env(spec, gpus)
                argv = [accelerate, *launch_args(spec)]
                run_id = self._write_run_folder(spec, argv, gpus, env_changes, waits_for=[r.run_id for r in ahead])
        except OSError as exc:  # a full disk, a read-only one
            raise self._cannot_write(exc) from None
        run_dir = self.run_dir(run_id)
        supervisor_process = backend.submit(spec, run_dir, inherited_env(), env_changes)
        if isinstance(supervisor_process, subprocess.Popen):  # reaped by status() so it never lingers as a zombie
            self._supervisors[run_id] = supervisor_process
        self._wait_until_launched(run_id)
        return run_id

    def _cannot_write(self, exc: OSError) -> RunError:
        return RunError(
            f"--runs-dir: cannot write a new run into {self.runs_dir} ({exc.strerror or exc}): free space on "
            "its disk, or choose another runs folder"
        )

    def _submit(self, spec, accelerate: str, backend: backends.Backend) -> str:
        """A run a scheduler outside tunedeck runs: write the run folder, have the backend check and submit it."""
        assert backend.prepare is not None
        argv, env_changes = backend.prepare(spec, accelerate, rank_env(spec, None))
        try:
            with self._start_lock():
                run_id = self._write_run_folder(spec, argv, None, env_changes, backend=backend.name)
        except OSError as exc:
            raise self._cannot_write(exc) from None
        run_dir = self.run_dir(run_id)
        try:
            backend.submit(spec, run_dir, inherited_env(), env_changes)
        except (*backend.unavailable, OSError) as exc:
            supervisor.record_end(run_dir, tries=2, retry_s=0, state="failed", ended_at=time.time(), error=str(exc))
            raise RunError(f"launch.backend: could not submit the run to {backend.name}: {exc}") from None
        return run_id

    def _write_run_folder(
        self,
        spec,
        argv: list[str],
        gpus: list[int] | None,
        env_changes: dict[str, str],
        backend: str = "local",
        waits_for: Sequence[str] = (),
    ) -> str:
        """Write the whole run folder under a hidden name, then rename it: a full disk leaves nothing behind."""
        from tunedeck.backend.render import render_bundle, write_bundle

        run_id = self._new_run_id()
        staging = self.runs_dir / f".{run_id}.partial"
        try:
            write_bundle(render_bundle(spec), staging)
            (staging / run_folder.LOGS_DIR).mkdir()
            # The environment tunedeck set on top of its own (PATH only gains the venv's bin).
            env = {k: v for k, v in env_changes.items() if k != "PATH"}
            launch = spec.launch if backend == "local" else None  # the supervisor's stall watch and restarts
            status = run_folder.queued_status(run_id, run_title(spec), argv, gpus, env, waits_for, launch)
            queued_clock = {"created_monotonic": time.monotonic(), "created_in_boot": supervisor.boot_id()}
            write_status(staging, {**status, **queued_clock, "backend": backend})
            run_folder.write_reserve(staging)  # room for the final status if training fills the disk
            staging.rename(self.runs_dir / run_id)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return run_id

    def check_folder(self, create: bool) -> None:
        """RunError naming --runs-dir when the runs folder is a file or cannot be created."""
        from tunedeck.backend.runs import preflight

        if self.runs_dir.exists() and not self.runs_dir.is_dir():
            raise preflight.refusal(preflight.machine_problems(self.runs_dir))
        if create:
            try:
                self.runs_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunError(
                    f"--runs-dir: {self.runs_dir} cannot be created ({exc.strerror or exc}): give a folder that can be written"
                ) from None

    @contextlib.contextmanager
    def _start_lock(self):
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.runs_dir / ".start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @staticmethod
    def _ensure_demo_if_used(spec) -> None:
        from tunedeck.backend.data.demo import ensure_demo_if_used

        try:
            ensure_demo_if_used(spec)
        except RuntimeError as exc:
            raise RunError(str(exc)) from None

    def _new_run_id(self) -> str:
        """A fresh run id (called under the start lock, so no other start can pick it meanwhile)."""
        while True:
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
            if not (self.runs_dir / run_id).exists() and not (self.runs_dir / f".{run_id}.partial").exists():
                return run_id

    def _wait_until_launched(self, run_id: str, timeout: float = 15.0) -> None:
        """Until the supervisor has launched the run, or has recorded itself waiting for the runs ahead of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status.state != "queued" or (
                status.waits_for and run_folder.read_status_quietly(self.run_dir(run_id)).get("supervisor")
            ):
                return
            time.sleep(0.05)

    # ------------------------------------------------------------ stop

    def stop(self, run_id: str, grace_s: float = DEFAULT_GRACE_S) -> RunStatus:
        """Ask the run to stop: ranks finish their step and save, SIGKILL after grace_s. Returns at once."""
        status = self.status(run_id)
        if status.state not in ACTIVE_STATES:
            return status
        self._stop_requested.add(run_id)
        if status.folder_deleted:
            # No folder to drop the request into: its supervisor takes SIGTERM as the same request.
            found = run_status.live_supervisors(self.runs_dir).get(run_id)
            if found is not None:
                run_status.ask_to_stop(found)
            return dataclasses.replace(status, state="stopping")
        run_dir = self.run_dir(run_id)
        backend = backends.named(status.backend)
        try:
            backend.stop(run_dir, run_folder.read_status_quietly(run_dir), grace_s)
        except backend.unavailable as exc:
            job = (status.slurm or {}).get("job_id") or run_id
            raise RunError(f"could not stop {backend.name} job {job}: {exc}") from None
        return self.status(run_id)

    def wait(self, run_id: str, timeout: float | None = None, poll_s: float = 0.5) -> RunStatus:
        """Block until the run has ended (or timeout seconds pass); returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            try:
                status = self.status(run_id)
            except RunError:
                if last is None or not last.folder_deleted:
                    raise
                # Its supervisor has exited: no process of the run is left, and nothing of it was recorded.
                gone = run_status.deleted_path(self.run_dir(run_id))
                return dataclasses.replace(
                    last,
                    state="stopped" if run_id in self._stop_requested else "failed",
                    pid=None,
                    ended_at=time.time(),
                    error=f"{gone} was deleted while the run was live; its processes have ended, and nothing of the run was recorded",
                )
            last = status
            if deadline is not None and time.monotonic() > deadline:
                return status
            # The supervisor writes the final state just before it exits: wait for that exit too,
            # so that when wait() returns, no process of the run is left.
            if status.state not in ACTIVE_STATES and not self._supervisor_alive(run_id):
                return status
            time.sleep(poll_s)

    def _supervisor_alive(self, run_id: str) -> bool:
        proc = self._supervisors.get(run_id)
        if proc is not None:
            return proc.poll() is None
        return is_alive(run_folder.read_status_quietly(self.run_dir(run_id)).get("supervisor"))

    # ------------------------------------------------------------ read

    def run_dir(self, run_id: str) -> Path:
        """The folder of a run id; refuses anything but a plain run id (no paths, no traversal)."""
        if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
            raise RunError(f"{run_id!r} is not a run id (they look like 20250101-120000-a1b2c3)")
        return self.runs_dir / run_id

    def status(self, run_id: str) -> RunStatus:
        """The run's state; a damaged folder is a run in state "damaged", never an exception."""
        return self._status(run_id, supervisors=None)

    def _status(self, run_id: str, supervisors: dict | None) -> RunStatus:
        run_dir = self.run_dir(run_id)
        proc = self._supervisors.get(run_id)
        if proc is not None:
            proc.poll()  # reap our own child so it does not linger as a zombie
        try:
            data = read_status_file(run_dir)
            if data["state"] in ACTIVE_STATES:
                data = backends.of(data).follow(run_dir, data)
        except DamagedStatus as exc:
            return run_status.damaged(run_id, run_dir, str(exc))
        except FileNotFoundError:
            supervisors = run_status.live_supervisors(self.runs_dir) if supervisors is None else supervisors
            if run_id in supervisors:
                return run_status.orphan_status(run_id, run_dir, supervisors[run_id])
            if run_dir.is_dir():
                return run_status.damaged(run_id, run_dir, f"it has no {STATUS_FILE}")
            raise RunError(f"there is no run {run_id} in {self.runs_dir}") from None
        return run_status.from_status_file(run_id, data)

    def list_runs(self) -> list[RunStatus]:
        """Every run, newest first: a damaged folder is one damaged run; a live run whose folder was deleted is listed too."""
        try:
            names = {entry.name for entry in self.runs_dir.iterdir() if RUN_ID_PATTERN.match(entry.name)}
        except OSError:  # no runs folder yet (or not a folder: check_folder says so)
            names = set()
        supervisors = run_status.live_supervisors(self.runs_dir)
        runs = []
        for run_id in sorted(names | {name for name in supervisors if RUN_ID_PATTERN.match(name)}, reverse=True):
            try:
                runs.append(self._status(run_id, supervisors))
            except RunError:
                continue  # deleted since the listing
        return runs

    def active_run(self) -> str | None:
        """The newest run that is queued, running or stopping, if any."""
        for run in self.list_runs():
            if run.state in ACTIVE_STATES:
                return run.run_id
        return None

    def job(self, run_id: str) -> JobSpec | UnreadableJob:
        """The run's job.yaml as its JobSpec, or why it does not read as one (missing, damaged, another version)."""
        return read_job(self.run_dir(run_id))
