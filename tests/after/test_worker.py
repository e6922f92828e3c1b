"""The worker process ends when released, after its idle timeout and when its parent is gone (psutil)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tunedeck.backend.after.prompting import GenerationSettings
from tunedeck.backend.after.worker_client import Worker, WorkerError, WorkerPool
from tunedeck.backend.after.worker_device import Placement

from .helpers import gone

CPU = Placement("cpu", None, None, None)
HEAVY = ["torch", "transformers", "trl", "peft", "deepspeed", "bitsandbytes", "accelerate", "datasets"]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def drain(stream):
    """Read a generator to its end; its return value."""
    while True:
        try:
            next(stream)
        except StopIteration as done:
            return done.value


def test_worker_is_gone_after_release():
    worker = Worker(CPU)
    pid = worker.pid
    assert psutil.Process(pid).is_running() and not gone(pid)
    worker.release()
    assert gone(pid)


def test_worker_ends_itself_after_its_idle_timeout():
    worker = Worker(CPU, idle_timeout_s=1.0)
    try:
        wait_until(lambda: gone(worker.pid), 30, "the idle worker ended")
    finally:
        worker.release()


def test_worker_answers_errors_and_stays_up():
    worker = Worker(CPU)
    try:
        with pytest.raises(WorkerError, match="no model is loaded"):
            worker.call("generate", {"prompt": "hi"})
        with pytest.raises(WorkerError, match="unknown request 'nonsense'"):
            worker.call("nonsense")
        with pytest.raises(WorkerError, match="there is no run"):
            worker.call("load", {"runs_dir": "/nonexistent", "run_id": "20250101-120000-aaaaaa", "device": "cpu"})
        assert worker.alive
    finally:
        worker.release()


PARENT = textwrap.dedent(
    f"""
    import json, sys, time
    from tunedeck.backend.after.worker_client import ModelWorker, Worker
    from tunedeck.backend.after.worker_device import Placement
    from tunedeck.backend.after.prompting import GenerationSettings
    if len(sys.argv) > 1:  # a loaded model, busy answering a long prompt
        worker = ModelWorker.open(sys.argv[1], sys.argv[2])
        # Near-uniform sampling rarely ends at once; when a draw does end on its first token, draw again.
        settings = GenerationSettings(max_new_tokens=4096, temperature=5.0)
        answer = worker.generate("Q:", settings)
        while next(answer, None) is None:  # kept in a variable: a dropped answer is cancelled
            answer = worker.generate("Q:", settings)
    else:
        worker = Worker(Placement("cpu", None, None, None))
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    print(json.dumps({{"worker": worker.pid, "heavy": heavy}}), flush=True)
    time.sleep(600)
    """
)


def start_parent(*args) -> tuple[subprocess.Popen, dict]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *map(str, args)], stdout=subprocess.PIPE, text=True)
    facts = json.loads(parent.stdout.readline())
    return parent, facts


def test_worker_ends_when_its_parent_is_killed():
    parent, facts = start_parent()
    assert not gone(facts["worker"])
    parent.send_signal(signal.SIGKILL)  # no chance to release anything
    parent.wait()
    wait_until(lambda: gone(facts["worker"]), 20, "the orphaned worker ended")


@pytest.mark.integration
def test_worker_with_a_model_ends_when_its_parent_dies_mid_answer(demo_run):
    parent, facts = start_parent(*demo_run)
    assert facts["heavy"] == []  # the caller's process never imported the training stack
    worker = psutil.Process(facts["worker"])
    assert worker.memory_info().rss > 100 * 2**20  # torch and the model are loaded there
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_until(lambda: gone(facts["worker"]), 30, "the busy orphaned worker ended")


@pytest.mark.integration
def test_model_worker_streams_cancels_and_is_released(demo_run):
    runs_dir, run_id = demo_run
    pool = WorkerPool(idle_timeout_s=120)
    try:
        events = []
        worker = pool.get(runs_dir, run_id, on_event=events.append)
        assert (
            worker.info["weights"] == "final" and worker.info["template"] == "plain" and worker.info["device"] == "cpu"
        )
        assert any(e.get("stage") == "loading the final adapter" for e in events)
        assert pool.get(runs_dir, run_id) is worker  # one worker per loaded model
        base = pool.get(runs_dir, run_id, base=True)
        assert base.pid != worker.pid and base.info["weights"] == "base"

        prompt, greedy = "Q: Add the numbers. 3 + 4\nA:", GenerationSettings(max_new_tokens=6)
        pieces = list(worker.generate(prompt, greedy))
        assert "".join(pieces).strip()[:1].isdigit()
        assert list(worker.generate(prompt, greedy)) == pieces  # greedy: the same answer again
        # A stop string ends the answer before it; what was streamed never shows it.
        reverse = "Q: Reverse the letters. a b c\nA:"
        whole = "".join(worker.generate(reverse, GenerationSettings(max_new_tokens=12)))
        stop = whole.strip()[-1]  # the answer's last character: the stop string cuts it there
        stopped = list(worker.generate(reverse, GenerationSettings(max_new_tokens=12, stop=(stop,))))
        assert "".join(stopped) == whole[: whole.index(stop)]

        # The tokenizer's chat template, with an earlier turn: what a messages run would get.
        chat = worker.generate(
            "Add the numbers. 3 + 4", GenerationSettings(max_new_tokens=4), template="chat", history=[("hi", "hello")]
        )
        summary = drain(chat)
        assert (
            summary["template"] == "chat"
            and summary["new_tokens"] <= 4
            and summary["stop_reason"] in ("end", "max_new_tokens")
        )

        # A prompt the demo answers (a bare "Q:" may be answered by the end token at once), sampled for long.
        sampled = GenerationSettings(max_new_tokens=4096, temperature=5.0)
        long_answer = worker.generate(prompt, sampled)
        while next(long_answer, None) is None:  # a draw that ended on its first token: draw again
            long_answer = worker.generate(prompt, sampled)
        started = time.monotonic()
        long_answer.close()  # the caller walks away: the worker stops generating and takes the next prompt
        assert time.monotonic() - started < 30
        assert list(worker.generate(prompt, greedy)) == pieces

        pids = [worker.pid, base.pid]
        pool.release(runs_dir, run_id)
        assert gone(pids[0]) and not gone(pids[1])
        pool.release_all()
        assert gone(pids[1]) and pool.live() == {}
    finally:
        pool.release_all()


def test_client_side_imports_no_training_stack():
    code = (
        "import sys, json\n"
        "import tunedeck.backend.after.worker_client, tunedeck.backend.cli.after, tunedeck.backend.runs.checkpoints\n"
        "import tunedeck.backend.after.eval_results, tunedeck.backend.after.prompting, tunedeck.backend.after.hub\n"
        "import tunedeck.backend.cli\n"
        "tunedeck.backend.cli.build_parser()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
