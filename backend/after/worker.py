"""The worker process: holds one model for trying, or runs one evaluation or merge, for the panel and the CLI.

    python -m tunedeck.backend.after.worker --parent PID [--idle-timeout S]

The caller (backend/after/worker_client.py) talks to it over the process's own stdin and stdout, one
JSON object per line; the pipes are private to the two processes, so nothing listens on a port.
Requests: {"id", "op", "args"} with op load | generate | evaluate | merge | export_gguf | check_export | exit
(evaluate's args: run_id, names, data, limit, and optionally tasks, tasks_limit, task_dir, general_text), and
{"op": "cancel", "id"} for the request in flight. Replies carry the request's id:
{"event": "progress", "stage", "done", "total"}, {"event": "token", "text"} (streamed answers),
{"event": "warning", "message"}, then one {"event": "result", "value"} or {"event": "error", "message"}.

It ends on an exit request, when stdin closes (the caller released it or died), when its parent
process is gone (checked every second; a stuck task is cut off after a grace period), and after
--idle-timeout seconds without a request. Whatever the libraries print goes to stderr (the
caller's log), never into the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
import traceback

PARENT_POLL_S = 1.0
PARENT_GONE_GRACE_S = 10.0  # a task cut off by a vanished parent gets this long to notice the cancel


class Channel:
    """The protocol's output: fd 1 as it was at start; fd 1 itself is pointed at stderr."""

    def __init__(self):
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)  # print() and C libraries writing to stdout land in the log
        self._lock = threading.Lock()

    def send(self, message: dict) -> None:
        line = json.dumps(message, default=str) + "\n"
        with self._lock:
            self._out.write(line)
            self._out.flush()


class CancelToken:
    """is_set() for one request: true once a cancel for its id arrived, or the worker is going away."""

    def __init__(self, request_id, cancelled: set, shutdown: threading.Event):
        self.request_id, self._cancelled, self._shutdown = request_id, cancelled, shutdown

    def is_set(self) -> bool:
        return self.request_id in self._cancelled or self._shutdown.is_set()


def read_requests(stream, requests: queue.Queue, cancelled: set, shutdown: threading.Event) -> None:
    for line in stream:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "cancel":
            cancelled.add(request.get("id"))
        else:
            requests.put(request)
    shutdown.set()  # stdin closed: the caller is gone or let us go
    requests.put(None)


def watch_parent(parent: int, requests: queue.Queue, shutdown: threading.Event) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    shutdown.set()
    requests.put(None)
    time.sleep(PARENT_GONE_GRACE_S)
    os._exit(0)  # no orphan holds a GPU or RAM, even if a library call ignores the cancel


class Worker:
    """The request handlers and the one model this process holds."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.model = self.tokenizer = None
        self.loaded: dict = {}

    def _run(self, args: dict):
        from tunedeck.backend.runs.checkpoints import AfterError
        from tunedeck.backend.runs.job_file import UnreadableJob
        from tunedeck.backend.runs.manager import RunError, RunManager

        manager = RunManager(args["runs_dir"])
        try:
            run_dir = manager.run_dir(args["run_id"])
            manager.status(args["run_id"])
        except RunError as exc:
            raise AfterError(str(exc)) from None
        job = manager.job(args["run_id"])
        if isinstance(job, UnreadableJob):
            raise AfterError(f"run {args['run_id']}: {job.explained()}")
        return run_dir, job

    def _weights(self, run_dir, job, args):
        from tunedeck.backend.runs.checkpoints import select

        return select(run_dir, job, args["run_id"], args.get("checkpoint"), bool(args.get("base")))

    def op_load(self, args, progress, cancel):
        from tunedeck.backend.after.model_load import load_model, loaded_as
        from tunedeck.backend.after.prompting import resolve_template

        run_dir, job = self._run(args)
        weights = self._weights(run_dir, job, args)
        self.model, self.tokenizer = load_model(run_dir, job, weights, args["device"], progress)
        fmt = job.dataset.format
        has_chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.loaded = {
            "weights": weights.name,
            "description": weights.describe(),
            "device": args["device"],
            "dataset_format": fmt,
            "chat_template": has_chat,
            "template": resolve_template("auto", fmt, has_chat),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "loaded_as": loaded_as(self.model),
        }
        return self.loaded

    def op_generate(self, args, progress, cancel):
        from tunedeck.backend.after.generate import encode_prompt, stream
        from tunedeck.backend.after.prompting import GenerationSettings, resolve_template
        from tunedeck.backend.runs.checkpoints import AfterError

        if self.model is None:
            raise AfterError("no model is loaded in this worker: load one first")
        settings = GenerationSettings.from_dict(args.get("settings") or {})
        template = resolve_template(
            args.get("template") or "auto", self.loaded["dataset_format"], self.loaded["chat_template"]
        )
        chat = template == "chat"  # the other templates have no place for earlier turns or a system message
        history = [tuple(turn) for turn in args.get("history") or []] if chat else None
        system = str(args.get("system") or "") if chat else ""
        inputs = encode_prompt(self.tokenizer, template, str(args.get("prompt", "")), history, system)
        pieces = stream(self.model, self.tokenizer, inputs, settings, cancel)
        while True:
            try:
                self.channel.send({"id": self.request_id, "event": "token", "text": next(pieces)})
            except StopIteration as done:
                return {**done.value, "template": template}

    def op_evaluate(self, args, progress, cancel):
        from tunedeck.backend.after.benchmarks import Benchmarks
        from tunedeck.backend.after.eval_results import save_results
        from tunedeck.backend.after.evaluate import evaluate_run

        run_dir, job = self._run(args)
        outcome = evaluate_run(
            run_dir,
            job,
            args["names"],
            args["device"],
            args.get("data"),
            args.get("limit"),
            progress,
            cancel,
            Benchmarks.from_args(args),
            args.get("general_text"),
        )
        saved = save_results(run_dir, outcome["results"])  # each model's answers go to their own file
        return {**outcome, "results": {name: saved["results"][name] for name in outcome["results"]}}

    def op_merge(self, args, progress, cancel):
        from tunedeck.backend.after.merge import merge_run

        run_dir, job = self._run(args)
        weights = self._weights(run_dir, job, args)
        return merge_run(
            run_dir, job, args["run_id"], weights, args["out_dir"], args["dtype"], args["device"], progress
        )

    def op_export_gguf(self, args, progress, cancel):
        from tunedeck.backend.after.gguf_export import export_gguf

        run_dir, job = self._run(args)
        weights = self._weights(run_dir, job, args)
        return export_gguf(
            run_dir, job, args["run_id"], weights, args["quants"], args["out_dir"], args["device"], progress
        )

    def op_check_export(self, args, progress, cancel):
        from tunedeck.backend.after.export_check import check_export

        run_dir, job = self._run(args)
        weights = self._weights(run_dir, job, args)
        return check_export(run_dir, job, weights, args["target"], args["device"], args["prompts"], progress)

    def handle(self, request: dict, cancel: CancelToken) -> None:
        from tunedeck.backend.after.evaluate import Cancelled
        from tunedeck.backend.after.prompting import SettingsError
        from tunedeck.backend.runs.checkpoints import AfterError

        self.request_id = request_id = request.get("id")
        handler = getattr(self, f"op_{request.get('op')}", None)

        def progress(stage: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise Cancelled()
            self.channel.send({"id": request_id, "event": "progress", "stage": stage, "done": done, "total": total})

        try:
            if handler is None:
                raise AfterError(f"unknown request {request.get('op')!r}")
            value = handler(request.get("args") or {}, progress, cancel)
            self.channel.send({"id": request_id, "event": "result", "value": value})
        except Cancelled:
            self.channel.send({"id": request_id, "event": "error", "message": "cancelled", "cancelled": True})
        except (AfterError, SettingsError) as exc:
            self.channel.send({"id": request_id, "event": "error", "message": str(exc)})
        except Exception as exc:  # noqa: BLE001 - any failure is one error reply; the worker stays up
            traceback.print_exc()
            self.channel.send({"id": request_id, "event": "error", "message": f"{type(exc).__name__}: {exc}"})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="tunedeck's model worker (started by the panel and the CLI)")
    parser.add_argument("--parent", type=int, required=True, help="the caller's pid: the worker ends when it is gone")
    parser.add_argument("--idle-timeout", type=float, default=900.0, help="seconds without a request before it ends")
    args = parser.parse_args(argv)
    channel = Channel()
    requests: queue.Queue = queue.Queue()
    cancelled: set = set()
    shutdown = threading.Event()
    threading.Thread(target=read_requests, args=(sys.stdin, requests, cancelled, shutdown), daemon=True).start()
    threading.Thread(target=watch_parent, args=(args.parent, requests, shutdown), daemon=True).start()
    worker = Worker(channel)
    channel.send({"event": "hello", "pid": os.getpid()})
    while True:
        try:
            request = requests.get(timeout=args.idle_timeout)
        except queue.Empty:
            channel.send({"event": "bye", "reason": "idle"})
            return 0
        if request is None or request.get("op") == "exit":
            return 0
        worker.handle(request, CancelToken(request.get("id"), cancelled, shutdown))


if __name__ == "__main__":
    sys.exit(main())
