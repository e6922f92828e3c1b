"""The caller's side of the worker process (backend/after/worker.py): stdlib only, never torch.

    worker = ModelWorker.open(runs_dir, run_id, checkpoint=None, base=False)   # starts it, loads the model
    for piece in worker.generate("Q: Add the numbers. 2 + 3\\nA:", GenerationSettings()):
        print(piece, end="")
    worker.release()                                                           # the process ends

    result = run_task("evaluate", {...}, on_event)   # a worker for one evaluation or merge

One worker per loaded model; WorkerPool keeps the panel's (keyed by run, weights) and releases them
all when the panel exits. A worker also ends by itself after its idle timeout and when its parent
is gone, so none outlives the panel.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tunedeck.backend.after.prompting import GenerationSettings
from tunedeck.backend.after.worker_device import Placement, place
from tunedeck.backend.spec import JobSpec

DEFAULT_IDLE_TIMEOUT_S = 900.0
LOG_TAIL_CHARS = 2000


class WorkerError(Exception):
    """A worker could not do what was asked; the message is for the user."""

    def __init__(self, message: str, cancelled: bool = False):
        super().__init__(message)
        self.cancelled = cancelled


class Worker:
    """One worker process and its pipes; one request at a time."""

    def __init__(self, placement: Placement, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S):
        self.placement = placement
        self.idle_timeout_s = idle_timeout_s
        self._ids = itertools.count(1)
        self._busy = threading.Lock()
        self._in_flight: int | None = None
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        env["CUDA_VISIBLE_DEVICES"] = "" if placement.gpu is None else str(placement.gpu)
        if placement.gpu is None and not os.environ.get("OMP_NUM_THREADS"):
            # As for CPU training runs (backend/runs/manager.py): every core busy in one process thrashes a small machine.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 2) // 2))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tunedeck.backend.after.worker",
                "--parent",
                str(os.getpid()),
                "--idle-timeout",
                str(idle_timeout_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            encoding="utf-8",
            bufsize=1,
            start_new_session=True,  # a Ctrl-C meant for the panel or the CLI reaches the worker as a cancel, not a signal
        )
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both are pipes (PIPE above); Popen types them Optional
        self.stdin, self.stdout = stdin, stdout
        try:
            hello = self._read()
            if hello.get("event") != "hello":
                raise self._ended(f"the worker did not start: {hello}")
        except BaseException:
            self.release()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> dict:
        line = self.stdout.readline()
        if not line:
            raise self._ended("the worker process ended")
        return json.loads(line)

    def _send(self, message: dict) -> None:
        try:
            self.stdin.write(json.dumps(message) + "\n")
            self.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._ended("the worker process is gone") from None

    def _ended(self, what: str) -> WorkerError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return WorkerError(what + (f" (exit code {code})" if code is not None else "") + self.log_tail())

    def log_tail(self) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - LOG_TAIL_CHARS))
            text = self._log.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return f"; its last output:\n{text}" if text else ""

    def events(self, op: str, args: dict | None = None) -> Generator[dict, None, Any]:
        """Send one request; yield its progress/token/warning events; return (StopIteration.value) its result.

        Closing the generator early cancels the request and waits for the worker to settle.
        """
        if not self._busy.acquire(blocking=False):
            raise WorkerError("the model is busy with another request: wait for it or cancel it")
        request_id = next(self._ids)
        finished = False
        try:
            self._in_flight = request_id
            self._send({"id": request_id, "op": op, "args": args or {}})
            while True:
                event = self._read()
                if event.get("id") != request_id:
                    continue  # a late reply to an earlier, cancelled request
                kind = event.get("event")
                if kind == "result":
                    finished = True
                    return event.get("value")
                if kind == "error":
                    finished = True
                    raise WorkerError(event.get("message", "the worker failed"), cancelled=bool(event.get("cancelled")))
                yield event
        finally:
            if not finished and self.alive:
                self._drain(request_id)
            self._in_flight = None
            self._busy.release()

    def _drain(self, request_id: int) -> None:
        try:
            self._send({"op": "cancel", "id": request_id})
            while self._read().get("event") not in ("result", "error"):
                pass
        except WorkerError:
            pass

    def call(self, op: str, args: dict | None = None, on_event: Callable[[dict], None] | None = None):
        """Run one request to its end; every event goes to on_event; returns the result."""
        stream = self.events(op, args)
        while True:
            try:
                event = next(stream)
            except StopIteration as done:
                return done.value
            if on_event:
                on_event(event)

    def cancel(self) -> None:
        """Ask the request in flight to stop (its caller gets WorkerError(cancelled=True))."""
        if self._in_flight is not None and self.alive:
            try:
                self._send({"op": "cancel", "id": self._in_flight})
            except WorkerError:
                pass

    def release(self, timeout: float = 10.0) -> None:
        """End the process: exit request, then closed stdin, then SIGKILL after timeout."""
        if self.alive:
            self.cancel()
            try:
                self.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.stdout, self.stdin):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        self._log.close()


def _job(runs_dir: Path, run_id: str) -> JobSpec:
    from tunedeck.backend.runs.checkpoints import AfterError
    from tunedeck.backend.runs.job_file import UnreadableJob
    from tunedeck.backend.runs.manager import RunError, RunManager

    manager = RunManager(runs_dir)
    try:
        manager.status(run_id)
    except RunError as exc:
        raise AfterError(str(exc)) from None
    job = manager.job(run_id)
    if isinstance(job, UnreadableJob):
        raise AfterError(f"run {run_id}: {job.explained()}")
    return job


class ModelWorker(Worker):
    """A worker holding one model of a run, for trying it."""

    info: dict

    @classmethod
    def open(
        cls,
        runs_dir,
        run_id: str,
        checkpoint: int | None = None,
        base: bool = False,
        *,
        taken=frozenset(),
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        on_event=None,
    ) -> ModelWorker:
        """Start a worker and load the model; WorkerError (or AfterError for a bad choice) when it cannot."""
        from tunedeck.backend.runs.checkpoints import select
        from tunedeck.backend.runs.manager import RunManager

        runs_dir = Path(runs_dir).resolve()
        job = _job(runs_dir, run_id)
        select(
            RunManager(runs_dir).run_dir(run_id), job, run_id, checkpoint, base
        )  # a bad choice fails here, before a process starts
        placement = place(job, runs_dir, taken)
        worker = cls(placement, idle_timeout_s)
        if placement.warning and on_event:
            on_event({"event": "warning", "message": placement.warning})
        args = {
            "runs_dir": str(runs_dir),
            "run_id": run_id,
            "checkpoint": checkpoint,
            "base": base,
            "device": placement.device,
        }
        try:
            worker.info = worker.call("load", args, on_event)
        except BaseException:
            worker.release()
            raise
        worker.info["warning"] = placement.warning
        return worker

    def generate(
        self, prompt: str, settings: GenerationSettings, template: str = "auto", history=None, system: str = ""
    ) -> Iterator[str]:
        """Yield the answer's text as it is generated; the summary (text, new_tokens, seconds, stop_reason) is the return value.

        history (earlier (user, assistant) turns) and system (a system message) reach a chat template only."""
        args = {
            "prompt": prompt,
            "settings": settings.to_dict(),
            "template": template,
            "history": history or [],
            "system": system,
        }
        stream = self.events("generate", args)
        try:
            while True:
                try:
                    event = next(stream)
                except StopIteration as done:
                    return done.value
                if event.get("event") == "token":
                    yield event["text"]
        finally:
            stream.close()  # abandoned early: cancels the answer in the worker


def run_task(
    op: str, args: dict, job: JobSpec, runs_dir, on_event=None, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
):
    """Start a worker, run one evaluate or merge request on the best device, and end the worker."""
    from tunedeck.backend.after.evaluate import BATCH_SIZE

    batch = BATCH_SIZE if op == "evaluate" else 1
    with task_worker(job, runs_dir, on_event, batch, idle_timeout_s) as call:
        return call(op, args)


@contextmanager
def task_worker(
    job: JobSpec, runs_dir, on_event=None, batch: int = 1, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
) -> Iterator[Callable[[str, dict], Any]]:
    """A worker on the best device for requests made one after another (an export, then its check: one start and
    one import of the stack); `call(op, args)` returns each result. The worker ends when the block does."""
    placement = place(job, Path(runs_dir), frozenset(), batch=batch)
    worker = Worker(placement, idle_timeout_s)
    try:
        if placement.warning and on_event:
            on_event({"event": "warning", "message": placement.warning})
        yield lambda op, args: worker.call(
            op, {**args, "runs_dir": str(Path(runs_dir).resolve()), "device": placement.device}, on_event
        )
    finally:
        worker.release()


def run_export(
    op: str, args: dict, job: JobSpec, runs_dir, check_prompts: int = 0, on_event=None
) -> tuple[dict, list[dict]]:
    """A merge or GGUF export (op "merge" or "export_gguf"), then, when check_prompts > 0, the export check of what it
    wrote (each merged folder or .gguf file) in the same worker: (the export's result, a check report per target)."""
    with task_worker(job, runs_dir, on_event) as call:
        result = call(op, args)
        if op == "merge":
            targets = [result["out_dir"]]
        else:
            targets = [str(Path(result["out_dir"]) / made["file"]) for made in result["files"].values()]
        check = {"run_id": args["run_id"], "checkpoint": args.get("checkpoint"), "prompts": check_prompts}
        reports = [call("check_export", {**check, "target": target}) for target in targets] if check_prompts else []
    return result, reports


class WorkerPool:
    """The panel's workers, one per (runs folder, run, weights); all released when the panel exits."""

    def __init__(self, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S):
        self.idle_timeout_s = idle_timeout_s
        self._workers: dict[tuple, ModelWorker] = {}
        self._lock = threading.Lock()
        atexit.register(self.release_all)

    @staticmethod
    def key(runs_dir, run_id: str, checkpoint: int | None, base: bool) -> tuple:
        return (str(Path(runs_dir).resolve()), run_id, "base" if base else checkpoint)

    def get(
        self, runs_dir, run_id: str, checkpoint: int | None = None, base: bool = False, on_event=None
    ) -> ModelWorker:
        """The live worker for this model, started (and loaded) when there is none."""
        key = self.key(runs_dir, run_id, checkpoint, base)
        with self._lock:
            worker = self._workers.get(key)
            if worker is not None and worker.alive:
                return worker
            if worker is not None:  # ended by its idle timeout
                self._workers.pop(key).release()
            taken = frozenset(
                w.placement.gpu for w in self._workers.values() if w.alive and w.placement.gpu is not None
            )
        # Loading takes a while: outside the lock, so two models (side by side) load at once.
        worker = ModelWorker.open(
            runs_dir, run_id, checkpoint, base, taken=taken, idle_timeout_s=self.idle_timeout_s, on_event=on_event
        )
        with self._lock:
            other = self._workers.get(key)
            if other is not None and other.alive:  # another session loaded the same model meanwhile
                worker.release()
                return other
            self._workers[key] = worker
            return worker

    def release(self, runs_dir, run_id: str, checkpoint: int | None = None, base: bool = False) -> bool:
        with self._lock:
            worker = self._workers.pop(self.key(runs_dir, run_id, checkpoint, base), None)
        if worker is None:
            return False
        worker.release()
        return True

    def release_all(self) -> None:
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.release()

    def live(self) -> dict[tuple, ModelWorker]:
        with self._lock:
            return {k: w for k, w in self._workers.items() if w.alive}
