"""TUNEDECK_NOTIFY_URL: rank 0 POSTs how the run ended (a local HTTP server stands in for Slack's webhook)."""

from __future__ import annotations

import http.server
import json
import signal
import threading

import pytest

from runs.helpers import log_records, logs_tail, run_processes, tunedeck, wait_for
from tunedeck.backend import cli_runs, train
from tunedeck.backend.runs import RunManager


class Hook:
    """An HTTP endpoint on 127.0.0.1 that keeps every POST body it gets."""

    def __init__(self, status: int = 200):
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                received.append((self.path, self.headers["Content-Type"], json.loads(self.rfile.read(length))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/secret-token"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    endpoint = Hook()
    yield endpoint
    endpoint.close()


def test_without_the_variable_nothing_is_sent_and_a_bad_url_or_a_refusing_endpoint_is_a_warning(
    hook, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(train.NOTIFY_ENV, raising=False)
    train.notify(tmp_path, "finished", None, 12.0)
    assert hook.received == []
    monkeypatch.setenv(train.NOTIFY_ENV, "file:///etc/passwd")
    train.notify(tmp_path, "finished", None, 12.0)
    assert "warning: TUNEDECK_NOTIFY_URL is not an http(s) URL: no notification will be sent" in capsys.readouterr().err
    cli_runs._say_where_it_notifies()  # what `tunedeck train` says before it starts the run
    assert "warning: TUNEDECK_NOTIFY_URL is not an http(s) URL: no notification will be sent" in capsys.readouterr().err
    monkeypatch.setenv(train.NOTIFY_ENV, hook.url)
    cli_runs._say_where_it_notifies()
    out = capsys.readouterr().out
    assert out == "when it ends, rank 0 posts how it ended to 127.0.0.1 (TUNEDECK_NOTIFY_URL)\n"

    refusing = Hook(status=403)
    try:
        monkeypatch.setenv(train.NOTIFY_ENV, refusing.url)
        train.notify(tmp_path, "failed", "boom", 3725.0)  # never raises: the run's own end comes first
    finally:
        refusing.close()
    err = capsys.readouterr().err
    assert "warning: the notification to 127.0.0.1 failed: HTTP Error 403" in err
    assert "secret-token" not in err  # a webhook's path is its secret
    assert refusing.received[0][2]["text"] == f"tunedeck run {tmp_path.name} failed after 1:02:05 · boom"


@pytest.mark.integration
def test_a_finished_and_a_failed_run_each_post_once_how_they_ended(hook, runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(train.NOTIFY_ENV, hook.url)
    done = tunedeck("train", "demo", "--runs-dir", runs_dir, "--set", "training.max_steps=3", timeout=240)
    assert done.returncode == 0, done.stderr
    assert "when it ends, rank 0 posts how it ended to 127.0.0.1 (TUNEDECK_NOTIFY_URL)" in done.stdout
    manager = RunManager(runs_dir)
    run_id = manager.list_runs()[0].run_id
    [(path, kind, body)] = hook.received
    assert (path, kind) == ("/services/T000/B000/secret-token", "application/json")
    assert (body["run"], body["state"], body["step"], body["max_steps"], body["error"]) == (
        run_id,
        "finished",
        3,
        3,
        None,
    )
    assert body["text"].startswith(f"tunedeck run {run_id} finished after 0:00:") and body["content"] == body["text"]
    assert body["text"].endswith(f" · step 3/3 · loss {body['loss']:.4f}")

    monkeypatch.setenv("TUNEDECK_FAULT", "rank=0,step=2")
    failed = manager.start(demo_spec({"training.max_steps": 50}))
    assert manager.wait(failed, timeout=180).state == "failed"
    body = hook.received[-1][2]
    assert len(hook.received) == 2 and (body["run"], body["state"]) == (failed, "failed")
    assert body["error"].startswith("RuntimeError: fault injected by TUNEDECK_FAULT on rank 0 at step 2")


@pytest.mark.integration
def test_a_run_whose_rank_0_was_killed_is_posted_by_its_supervisor(hook, runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(train.NOTIFY_ENV, hook.url)
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({"training.max_steps": 2000, "training.save_steps": 1000}))
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=f"training\n{logs_tail(run_dir)}")
    ranks = {p.environ().get("RANK"): p for p in run_processes(run_dir)[0].children()}
    ranks["0"].send_signal(signal.SIGKILL)  # as the kernel's OOM killer would: no end record, no post of its own

    assert manager.wait(run_id, timeout=180).state == "failed"
    [(_, _, body)] = hook.received
    assert (body["run"], body["state"], body["step"]) == (run_id, "failed", log_records(run_dir)[-1]["step"])
    assert body["error"].startswith("rank 0 was killed by SIGKILL (signal 9): out of memory"), body["error"]
    assert body["text"].startswith(f"tunedeck run {run_id} failed after 0:0")
