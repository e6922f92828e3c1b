"""Run manager: start a job as a run folder, watch it, stop it, re-attach, list past runs.

A run is a folder under the runs directory (see DESIGN.md, "A run folder"): the job's
bundle (job.yaml, accelerate_config.yaml, ds_config.json, training_args.yaml, launch.sh,
train_sft.py), status.json, metrics.jsonl, logs/. The disk is the message bus: the
manager keeps no state that a restart could lose. Each run is owned by a small
supervisor process (backend/supervisor.py) in its own session, which starts
`accelerate launch` in its own process group, carries out stops and records the exit
code; the manager only writes requests and reads status.json.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from backend import supervisor
from backend.spec import spec_to_dict
from backend.supervisor import ACTIVE_STATES, STOP_FILE, is_alive, read_status, write_status

RUN_ID_PATTERN = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
DEFAULT_GRACE_S = 60.0


class RunError(Exception):
    """Why a run cannot be started, found or stopped; the message is for the user."""


@dataclass
class RunStatus:
    run_id: str
    state: str  # queued | running | stopping | finished | failed | stopped
    pid: int | None  # the launcher (`accelerate launch`), leader of the run's process group
    started_at: float | None  # seconds since the epoch
    ended_at: float | None
    exit_code: int | None
    error: str | None  # on failure: the error lines of the rank that failed first
    title: str  # one line: model, method, strategy


def gpu_indices() -> list[int]:
    """Indices of this machine's NVIDIA GPUs (NVML), or [] without a GPU or driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError and ImportError alike: no usable GPU
        return []
    try:
        return list(range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()


def format_clock(seconds: float) -> str:
    """Elapsed time or ETA as people read it: 0:21, 12:05, 3:07:44."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def run_title(job: dict) -> str:
    model = str((job.get("model") or {}).get("name_or_path", "?"))
    if os.path.isabs(model) or model.startswith("."):
        model = "/".join(Path(model).parts[-2:])  # a local folder: its last two names say enough
    strategy, launch = job.get("strategy") or {}, job.get("launch") or {}
    where = "CPU" if launch.get("use_cpu") else "GPU"
    return f"{model} · {job.get('method', '?')} · {strategy.get('kind', '?')} · {launch.get('num_processes', 1)}x{where}"


class RunManager:
    def __init__(self, runs_dir: Path | str = "runs"):
        self.runs_dir = Path(runs_dir).resolve()
        self._supervisors: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------ start

    def start(self, spec) -> str:
        """Validate, create the run folder and launch it; returns the run id. Raises RunError."""
        from backend.render import render_bundle, write_bundle
        from backend.validate import validate

        errors = [p for p in validate(spec) if p.level == "error"]
        if errors:
            raise RunError("the job has errors:\n" + "\n".join(f"- {p.field}: {p.message}" for p in errors))
        accelerate = self._accelerate_command()
        self._check_resume(spec)
        self._ensure_demo_if_used(spec)
        with self._start_lock():  # two starts at once must not both claim the same GPUs
            gpus = self._claim_gpus(spec)
            run_id = self._new_run_id()
            run_dir = self.runs_dir / run_id
            write_bundle(render_bundle(spec), run_dir)
            (run_dir / "logs").mkdir(exist_ok=True)
            env_changes = self._env_changes(spec, gpus)
            write_status(
                run_dir,
                {
                    "run_id": run_id,
                    "state": "queued",
                    "title": run_title(spec_to_dict(spec)),
                    "created_at": time.time(),
                    "started_at": None,
                    "ended_at": None,
                    "exit_code": None,
                    "error": None,
                    "gpu_ids": gpus,
                    "argv": [accelerate, *self._launch_args(spec)],
                    # What tunedeck set on top of its own environment (PATH only gains the venv's bin).
                    "env": {k: v for k, v in env_changes.items() if k != "PATH"},
                },
            )
        # From here on the supervisor is the only writer of status.json (it records itself first).
        # It runs as a script (it needs only psutil), so it works whether or not tunedeck is installed.
        try:
            with open(run_dir / "logs" / "supervisor.log", "ab") as log:
                self._supervisors[run_id] = subprocess.Popen(
                    [sys.executable, supervisor.__file__, str(run_dir)],
                    cwd=run_dir,
                    env={**os.environ, **env_changes},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # survives the manager (and a Ctrl-C in its terminal)
                )
        except OSError as exc:
            supervisor.update_status(run_dir, state="failed", ended_at=time.time(), error=f"could not start the supervisor: {exc}")
            raise RunError(f"could not start the run: {exc}") from None
        self._wait_until_launched(run_id)
        return run_id

    def _claim_gpus(self, spec) -> list[int] | None:
        """The GPUs the run will use; refuses GPUs that a live run holds. None for CPU runs."""
        launch = spec.launch
        if launch.use_cpu:
            return None
        available = gpu_indices()
        if not available:
            raise RunError(
                "no NVIDIA GPU found on this machine: set launch.use_cpu to true to train on CPU processes "
                "(gloo), as the demo preset does"
            )
        wanted = available if launch.gpu_ids == "all" else [int(i) for i in launch.gpu_ids.split(",") if i]
        missing = [i for i in wanted if i not in available]
        if missing:
            names = f"GPU {missing[0]} does" if len(missing) == 1 else f"GPUs {', '.join(map(str, missing))} do"
            raise RunError(
                f"launch.gpu_ids: {names} not exist here; this machine has GPUs {', '.join(map(str, available))}"
            )
        wanted = wanted[: launch.processes_per_machine]
        if len(wanted) < launch.processes_per_machine:
            raise RunError(
                f"launch.num_processes: {launch.processes_per_machine} processes need as many GPUs, and only "
                f"{len(wanted)} are available: lower launch.num_processes"
            )
        for other in self.list_runs():
            if other.state not in ACTIVE_STATES:
                continue
            held = set(read_status(self.run_dir(other.run_id)).get("gpu_ids") or [])
            clash = sorted(held & set(wanted))
            if clash:
                names = f"GPU {clash[0]} is" if len(clash) == 1 else f"GPUs {', '.join(map(str, clash))} are"
                raise RunError(
                    f"{names} in use by run {other.run_id} ({other.title}): stop it, or set launch.gpu_ids to free GPUs"
                )
        return wanted

    def _check_resume(self, spec) -> None:
        """Resuming needs an output folder that outlives a run: a relative one is inside the new, empty run folder."""
        if not spec.training.resume_from_checkpoint or Path(spec.output_dir).expanduser().is_absolute():
            return
        example = next(
            (
                self.runs_dir / run.run_id / spec.output_dir
                for run in self.list_runs()
                if any((self.runs_dir / run.run_id / spec.output_dir).glob("checkpoint-*"))
            ),
            None,
        )
        raise RunError(
            f"training.resume_from_checkpoint: output_dir {spec.output_dir!r} is relative to the new run's own "
            "folder, which has no checkpoint to continue from, so the run would start again at step 0; set "
            "output_dir to the absolute path of the output folder of the run to continue"
            + (f", e.g. {example} (the newest run with checkpoints)" if example else "")
        )

    @contextlib.contextmanager
    def _start_lock(self):
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.runs_dir / ".start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @staticmethod
    def _accelerate_command() -> str:
        # The console script of the same environment as this Python, not whatever PATH finds first.
        candidate = Path(sys.executable).parent / "accelerate"
        if candidate.is_file():
            return str(candidate)
        raise RunError(
            f"the accelerate command is not installed next to {sys.executable}: install the training stack "
            "(pip install 'tunedeck[train]')"
        )

    @staticmethod
    def _launch_args(spec) -> list[str]:
        from backend.render.launch import launch_argv

        args = launch_argv(spec)
        if spec.launch.num_machines == 1:
            # On one machine the rendezvous port is private: let accelerate pick a free one, so
            # two runs (or a run and someone's notebook) never collide on 29500.
            args[1:1] = ["--main_process_port", "0"]
        return args

    @staticmethod
    def _env_changes(spec, gpus: list[int] | None) -> dict[str, str]:
        per_machine = spec.launch.processes_per_machine
        env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        if spec.strategy.is_deepspeed and not os.environ.get("TORCH_EXTENSIONS_DIR"):
            # DeepSpeed compiles an op against this environment's torch on first use (~1 min); keyed by
            # environment, two virtualenvs on one machine do not keep rebuilding each other's copy.
            key = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
            env["TORCH_EXTENSIONS_DIR"] = str(Path.home() / ".cache" / "torch_extensions" / f"tunedeck-{key}")
        if gpus is None:
            # Measured: several threads per process on a small machine make training ~6x slower.
            env["OMP_NUM_THREADS"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run stays on the CPU even on a GPU machine
        else:
            env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // per_machine))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        return env

    @staticmethod
    def _ensure_demo_if_used(spec) -> None:
        from backend.demo import ensure_demo_if_used

        try:
            ensure_demo_if_used(spec)
        except RuntimeError as exc:
            raise RunError(str(exc)) from None

    def _new_run_id(self) -> str:
        while True:
            run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
            try:
                (self.runs_dir / run_id).mkdir()
                return run_id
            except FileExistsError:
                continue

    def _wait_until_launched(self, run_id: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.status(run_id).state == "queued":
            time.sleep(0.05)

    # ------------------------------------------------------------ stop

    def stop(self, run_id: str, grace_s: float = DEFAULT_GRACE_S) -> RunStatus:
        """Ask the run to stop: ranks finish their step and save, SIGKILL after grace_s. Returns at once."""
        status = self.status(run_id)
        if status.state not in ACTIVE_STATES:
            return status
        run_dir = self.run_dir(run_id)
        (run_dir / STOP_FILE).write_text(json.dumps({"grace_s": grace_s, "time": time.time()}) + "\n")
        if not is_alive(read_status(run_dir).get("supervisor")):
            self._stop_without_supervisor(run_dir, grace_s)
        return self.status(run_id)

    @staticmethod
    def _stop_without_supervisor(run_dir: Path, grace_s: float) -> None:
        # Only when the supervisor died (killed by hand): stop the launcher's tree ourselves, then settle the status.
        import signal

        import psutil

        launcher = read_status(run_dir).get("launcher")
        if is_alive(launcher):
            root = psutil.Process(launcher["pid"])
            tree = [root, *root.children(recursive=True)]
            supervisor.kill_tree(root.children(), signal.SIGTERM, timeout=grace_s)
            supervisor.kill_tree(tree)
        state, error = supervisor.final_state(run_dir, None, stop_requested=True)
        supervisor.update_status(run_dir, state=state, ended_at=time.time(), error=error)

    def wait(self, run_id: str, timeout: float | None = None, poll_s: float = 0.5) -> RunStatus:
        """Block until the run has ended (or timeout seconds pass); returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(run_id)
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
        try:
            return is_alive(read_status(self.run_dir(run_id)).get("supervisor"))
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------ read

    def run_dir(self, run_id: str) -> Path:
        """The folder of a run id; refuses anything but a plain run id (no paths, no traversal)."""
        if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
            raise RunError(f"{run_id!r} is not a run id (they look like 20250101-120000-a1b2c3)")
        return self.runs_dir / run_id

    def status(self, run_id: str) -> RunStatus:
        run_dir = self.run_dir(run_id)
        try:
            data = read_status(run_dir)
        except FileNotFoundError:
            raise RunError(f"there is no run {run_id} in {self.runs_dir}") from None
        except ValueError:
            raise RunError(f"run {run_id}: status.json is damaged") from None
        proc = self._supervisors.get(run_id)
        if proc is not None:
            proc.poll()  # reap our own child so it does not linger as a zombie
        if data["state"] in ACTIVE_STATES:
            data = self._reattach(run_dir, data)
        launcher = data.get("launcher") or {}
        return RunStatus(
            run_id=run_id,
            state=data["state"],
            pid=launcher.get("pid"),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            exit_code=data.get("exit_code"),
            error=data.get("error"),
            title=data.get("title", ""),
        )

    @staticmethod
    def _reattach(run_dir: Path, data: dict) -> dict:
        """Trust an active state only while the supervisor that owns the run is alive (pid + start time)."""
        if is_alive(data.get("supervisor")):
            if data["state"] == "running" and (run_dir / STOP_FILE).exists():
                data = {**data, "state": "stopping"}
            return data
        # Between write and spawn the supervisor is not recorded yet: a fresh queued run is still fine.
        if data["state"] == "queued" and not data.get("supervisor") and time.time() - data["created_at"] < 30:
            return data
        data = read_status(run_dir)  # it may have finished between our two reads
        if data["state"] not in ACTIVE_STATES:
            return data
        if is_alive(data.get("launcher")):
            return data  # the supervisor was killed but training goes on: still running
        state, error = supervisor.final_state(run_dir, None, (run_dir / STOP_FILE).exists())
        return supervisor.update_status(run_dir, state=state, ended_at=data.get("ended_at") or time.time(), error=error)

    def list_runs(self) -> list[RunStatus]:
        """Every run in the runs folder, newest first."""
        if not self.runs_dir.is_dir():
            return []
        runs = []
        for entry in sorted(self.runs_dir.iterdir(), reverse=True):
            if RUN_ID_PATTERN.match(entry.name) and (entry / supervisor.STATUS_FILE).is_file():
                try:
                    runs.append(self.status(entry.name))
                except RunError:
                    continue
        return runs

    def active_run(self) -> str | None:
        """The newest run that is queued, running or stopping, if any."""
        for run in self.list_runs():
            if run.state in ACTIVE_STATES:
                return run.run_id
        return None

    def job(self, run_id: str) -> dict:
        """The run's job.yaml as a dict."""
        return yaml.safe_load((self.run_dir(run_id) / "job.yaml").read_text(encoding="utf-8")) or {}
