"""TUNEDECK_NOTIFY_URL: how a run ended is POSTed once, after the run's end is recorded, within 10 s all told, its
text escaped as Slack, Discord or Teams reads it (local HTTP servers stand in for the webhooks)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from runs.helpers import log_records, logs_tail, run_processes, status_json, tunedeck, wait_for
from tunedeck.backend import recipe
from tunedeck.backend.cli import train as cli_train
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.manager import RunManager


class Hook:
    """An HTTP endpoint on 127.0.0.1 that keeps every POST body it gets (and the Authorization header)."""

    def __init__(self, status: int = 200):
        received = self.received = []
        logins = self.logins = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                received.append((self.path, self.headers["Content-Type"], json.loads(self.rfile.read(length))))
                logins.append(self.headers["Authorization"])
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/secret-token"

    def wait(self, count: int, timeout: float = 30) -> list:
        """Until `count` posts arrived: the supervisor posts after it recorded the run's final state, so a post may
        land a moment after `tunedeck train` or RunManager.wait returned."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.received

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    endpoint = Hook()
    yield endpoint
    endpoint.close()


class TricklingHook:
    """An endpoint that reads the whole POST, then answers one byte every 0.2 s for as long as it is open: each read
    of the answer is quick, the answer never ends. `when_posted` runs as each POST has arrived."""

    def __init__(self, when_posted=None):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/services/T000/B000/secret-token"
        self.posted: list[dict] = []  # each POST's body, as it arrived
        self.when_posted = when_posted
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.closed.is_set():
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket):
        with connection:
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
                data += connection.recv(65536)
            self.posted.append(json.loads(data.split(b"\r\n\r\n", 1)[1]))
            if self.when_posted:
                self.when_posted(self.posted[-1])
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100000:
                if self.closed.wait(0.2):
                    return
                try:
                    connection.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self):
        self.closed.set()
        self.server.close()


def _length(request: bytes) -> int:
    head = request.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    return next(int(line.split(":", 1)[1]) for line in head.splitlines() if line.startswith("content-length:"))


def test_a_webhook_that_trickles_its_answer_is_left_within_the_deadline(tmp_path, monkeypatch, capsys):
    hook = TricklingHook()
    monkeypatch.setenv(recipe.NOTIFY_ENV, hook.url)
    monkeypatch.setattr(recipe.notifications, "NOTIFY_DEADLINE_S", 2, raising=False)
    try:
        began = time.monotonic()
        posting = threading.Thread(target=recipe.notify, args=(tmp_path, "finished", None, 12.0), daemon=True)
        posting.start()
        posting.join(8)
        took = time.monotonic() - began
    finally:
        hook.close()
    assert not posting.is_alive(), "notify still waits for the webhook's answer after 8 s"
    assert 2 <= took < 3, took  # connecting, sending and the answer: 2 s in all, not 2 s a read
    assert [body["state"] for body in hook.posted] == ["finished"]  # sent whole: only its answer never ended
    err = capsys.readouterr().err
    assert "warning: the notification to 127.0.0.1 failed: no whole answer within 2 s" in err
    assert "secret-token" not in err


def test_a_queued_run_starts_on_time_while_the_supervisor_of_the_run_ahead_posts_to_a_webhook_that_trickles(
    tmp_path,
):
    """Real supervisors, of a run whose launcher is killed (as rank 0 by the OOM killer: no end record) and of one
    queued after it; stand-in launchers (a Python line each), as training would tell nothing more here."""
    runs = tmp_path / "runs"
    ahead, queued = runs / "20250101-120000-aaaaaa", runs / "20250101-120001-bbbbbb"
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    for run_dir, argv, waits_for in ((ahead, kill, []), (queued, "pass", [ahead.name])):
        (run_dir / "logs").mkdir(parents=True)
        status = {"run_id": run_dir.name, "state": "queued", "title": "stand-in", "created_at": time.time()}
        status.update(argv=[sys.executable, "-c", argv], waits_for=waits_for)
        (run_dir / "status.json").write_text(json.dumps(status))
    states_when_posted = []
    hook = TricklingHook(lambda body: states_when_posted.append((body["run"], status_json(ahead)["state"])))
    env = {**os.environ, recipe.NOTIFY_ENV: hook.url}
    supervisors = []
    try:
        for run_dir in (ahead, queued):  # the queued one once the run ahead is recorded as its supervisor's
            command = [sys.executable, supervisor.__file__, str(run_dir)]
            supervisors.append(subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL))
            wait_for(lambda run_dir=run_dir: status_json(run_dir).get("supervisor"), 20, what="the supervisor")
        wait_for(lambda: states_when_posted, 20, what="the post of the run ahead")
        # Its end was recorded before the post went out, and the run queued after it starts while the post waits.
        assert states_when_posted[0] == (ahead.name, "failed")
        wait_for(lambda: status_json(queued).get("started_at"), 10, what="the queued run to start")
        assert psutil.Process(supervisors[0].pid).status() != psutil.STATUS_ZOMBIE  # still posting
        assert status_json(ahead)["error"] == "the launcher exited with code -9"
    finally:
        for process in supervisors:
            process.kill()
            process.wait()
        hook.close()


def test_a_url_with_a_user_and_password_posts_with_basic_auth_and_never_prints_them(
    hook, tmp_path, monkeypatch, capsys
):
    where = hook.url.split("//", 1)[1]
    monkeypatch.setenv(recipe.NOTIFY_ENV, f"http://tune%40deck:pa%3Ass@{where}")
    recipe.notify(tmp_path, "finished", None, 12.0)
    assert hook.logins == ["Basic " + base64.b64encode(b"tune@deck:pa:ss").decode()]
    assert hook.received[0][0] == "/services/T000/B000/secret-token"  # the credentials are not in the URL sent

    refusing = Hook(status=401)
    try:
        monkeypatch.setenv(recipe.NOTIFY_ENV, f"http://operator7:s3cret@{refusing.url.split('//', 1)[1]}")
        recipe.notify(tmp_path, "failed", "boom", 3.0)
    finally:
        refusing.close()
    err = capsys.readouterr().err
    assert "warning: the notification to 127.0.0.1 failed: HTTP Error 401" in err
    assert "s3cret" not in err and "operator7" not in err
    cli_train._say_where_it_notifies()
    assert "s3cret" not in capsys.readouterr().out


HOSTILE = "KeyError: '<!channel> @everyone [run me](http://evil.example/x) <http://evil.example|docs> *now* & more'"


def test_a_run_error_reaches_each_chat_service_as_text_it_shows_as_written(hook, tmp_path, monkeypatch):
    base = hook.url.split("/services/")[0]
    paths = ["/services/T000/B000/tok", "/api/webhooks/123/tok", "/webhookb2/abc@def/IncomingWebhook/x/y", "/hook"]
    for path in paths:
        monkeypatch.setenv(recipe.NOTIFY_ENV, base + path)
        recipe.notify(tmp_path, "failed", HOSTILE, 5.0)
    slack, discord, teams, other = (body for _, _, body in hook.received)
    # Slack: its three control characters as entities, nothing else (api.slack.com/reference/surfaces/formatting)
    assert slack["text"].endswith(
        " · KeyError: '&lt;!channel&gt; @everyone [run me](http://evil.example/x) &lt;http://evil.example|docs&gt; "
        "*now* &amp; more'"
    )
    # Discord: every markdown character escaped, and no mention parsed, whatever the text holds; no link preview
    assert discord["content"].endswith(
        r" · KeyError: '\<!channel\> \@everyone \[run me\]\(http://evil.example/x\) \<http://evil.example\|docs\> "
        r"\*now\* & more'"
    )
    assert (discord["allowed_mentions"], discord["flags"]) == ({"parse": []}, 4)
    # Teams: its card text takes Markdown and some HTML
    assert teams["text"].endswith(
        r" · KeyError: '&lt;\!channel&gt; @everyone \[run me\]\(http://evil.example/x\) &lt;http://evil.example\|docs&gt; "
        r"\*now\* &amp; more'"
    )
    assert other["text"].endswith(" · " + HOSTILE) and "allowed_mentions" not in other  # any other endpoint: as is
    assert {body["error"] for body in (slack, discord, teams, other)} == {HOSTILE}  # the field stays the error
    services = {
        "https://hooks.slack.com/services/T1/B2/x": "slack",
        "https://discord.com/api/webhooks/1/x": "discord",
        "https://contoso.webhook.office.com/webhookb2/a/IncomingWebhook/b/c": "teams",
        "https://ntfy.sh/runs": None,
    }
    assert {url: recipe.webhook_service(url) for url in services} == services


def test_without_the_variable_nothing_is_sent_and_a_bad_url_or_a_refusing_endpoint_is_a_warning(
    hook, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(recipe.NOTIFY_ENV, raising=False)
    recipe.notify(tmp_path, "finished", None, 12.0)
    assert hook.received == []
    monkeypatch.setenv(recipe.NOTIFY_ENV, "file:///etc/passwd")
    recipe.notify(tmp_path, "finished", None, 12.0)
    assert "warning: TUNEDECK_NOTIFY_URL is not an http(s) URL: no notification will be sent" in capsys.readouterr().err
    cli_train._say_where_it_notifies()  # what `tunedeck train` says before it starts the run
    assert "warning: TUNEDECK_NOTIFY_URL is not an http(s) URL: no notification will be sent" in capsys.readouterr().err
    monkeypatch.setenv(recipe.NOTIFY_ENV, hook.url)
    cli_train._say_where_it_notifies()
    out = capsys.readouterr().out
    assert out == "when it ends, how it ended is posted to 127.0.0.1 (TUNEDECK_NOTIFY_URL)\n"

    refusing = Hook(status=403)
    try:
        monkeypatch.setenv(recipe.NOTIFY_ENV, refusing.url)
        recipe.notify(tmp_path, "failed", "boom", 3725.0)  # never raises: the run's own end comes first
    finally:
        refusing.close()
    err = capsys.readouterr().err
    assert "warning: the notification to 127.0.0.1 failed: HTTP Error 403" in err
    assert "secret-token" not in err  # a webhook's path is its secret
    assert refusing.received[0][2]["text"] == f"tunedeck run {tmp_path.name} failed after 1:02:05 · boom"


@pytest.mark.integration
def test_a_finished_and_a_failed_run_each_post_once_how_they_ended(hook, runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(recipe.NOTIFY_ENV, hook.url)
    done = tunedeck("train", "demo", "--runs-dir", runs_dir, "--set", "training.max_steps=3", timeout=240)
    assert done.returncode == 0, done.stderr
    assert "when it ends, how it ended is posted to 127.0.0.1 (TUNEDECK_NOTIFY_URL)" in done.stdout
    manager = RunManager(runs_dir)
    run_id = manager.list_runs()[0].run_id
    [(path, kind, body)] = hook.wait(1)
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
    failed = manager.start(demo_spec({"training.max_steps": 50, "launch.max_restarts": 0}))  # one end, one post
    assert manager.wait(failed, timeout=180).state == "failed"
    body = hook.wait(2)[-1][2]
    assert len(hook.received) == 2 and (body["run"], body["state"]) == (failed, "failed")
    # the run's recorded error, as the page shows it
    assert body["error"] == manager.status(failed).error
    assert body["error"].startswith("rank 0 failed first: RuntimeError: fault injected by TUNEDECK_FAULT on rank 0")


@pytest.mark.integration
def test_a_run_whose_rank_0_was_killed_is_posted_by_its_supervisor(hook, runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(recipe.NOTIFY_ENV, hook.url)
    manager = RunManager(runs_dir)
    spec = demo_spec({"training.max_steps": 2000, "training.save_steps": 1000, "launch.max_restarts": 0})
    run_id = manager.start(spec)  # not started again: its one end is posted
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=f"training\n{logs_tail(run_dir)}")
    ranks = {p.environ().get("RANK"): p for p in run_processes(run_dir)[0].children()}
    ranks["0"].send_signal(signal.SIGKILL)  # as the kernel's OOM killer would: no end record, no post of its own

    assert manager.wait(run_id, timeout=180).state == "failed"
    [(_, _, body)] = hook.wait(1)
    assert (body["run"], body["state"], body["step"]) == (run_id, "failed", log_records(run_dir)[-1]["step"])
    assert body["error"].startswith("rank 0 was killed by SIGKILL (signal 9): out of memory"), body["error"]
    assert body["text"].startswith(f"tunedeck run {run_id} failed after 0:0")
