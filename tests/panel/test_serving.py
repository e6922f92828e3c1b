"""Serving safety: loopback by default, other addresses only with a password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.app.serving import ServingError, check_exposure, is_loopback, parse_credentials


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_hosts(host):
    assert is_loopback(host)
    check_exposure(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gpu-server.example.com"])
def test_exposed_hosts_need_a_password(host):
    assert not is_loopback(host)
    with pytest.raises(ServingError, match="--auth"):
        check_exposure(host, None)
    check_exposure(host, [("ann", "s3cret")])


def test_credentials_from_flag_and_file(tmp_path):
    assert parse_credentials("ann:pa:ss") == [("ann", "pa:ss")]
    file = tmp_path / "users"
    file.write_text("# team\nann:one\n\nbob:two\n")
    assert parse_credentials(auth_file=file) == [("ann", "one"), ("bob", "two")]
    with pytest.raises(ServingError, match="USER:PASS"):
        parse_credentials("ann")
    with pytest.raises(ServingError, match="no such file"):
        parse_credentials(auth_file=tmp_path / "missing")
    assert parse_credentials() is None


def test_cli_refuses_public_bind_without_auth():
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck", "ui", "--host", "0.0.0.0", "--port", "7999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0 without a password" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_rejects_unknown_preset():
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck", "ui", "--preset", "nope", "--port", "7999"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown preset 'nope'" in proc.stderr


def test_auth_protects_the_panel_and_its_api(tmp_path):
    import http.cookiejar
    import urllib.error
    import urllib.parse
    import urllib.request

    from panel.browser import PanelServer

    server = PanelServer(tmp_path / "runs", "--auth", "ann:s3cret")
    try:
        for path in ("config", "gradio_api/info"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(server.url + path, timeout=10)
            assert refused.value.code == 401
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

        def login(password):
            form = urllib.parse.urlencode({"username": "ann", "password": password}).encode()
            return opener.open(server.url + "login", data=form, timeout=10)

        with pytest.raises(urllib.error.HTTPError):
            login("wrong")
        assert login("s3cret").status == 200
        assert opener.open(server.url + "config", timeout=10).status == 200
    finally:
        server.stop()


def test_the_served_page_takes_back_gradios_idle_costs():
    """app/idle_costs.py: the queue's idle poll slowed, and the trackers' frame script first in <head>."""
    import inspect
    import urllib.request

    import gradio as gr
    from gradio import queueing

    from panel.browser import free_port
    from tunedeck.app.idle_costs import QUEUE_IDLE_POLL_S, TRACKER_FRAMES_JS
    from tunedeck.app.serving import launch

    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    assert list(assets.glob("statustracker-*.js")), "the script's stack test looks for Gradio's statustracker asset"
    assert "self.sleep_when_free" in inspect.getsource(queueing.Queue.start_processing)

    with gr.Blocks() as blocks:
        gr.Markdown("hello")
    port = free_port()
    launch(blocks, "127.0.0.1", port, None, block=False)
    try:
        assert blocks._queue.sleep_when_free == QUEUE_IDLE_POLL_S
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as reply:
            page = reply.read().decode()
            length = int(reply.headers["Content-Length"])
        head = page[page.index("<head>") :]
        assert head.startswith("<head><script>" + TRACKER_FRAMES_JS + "</script>")
        assert head.index(TRACKER_FRAMES_JS) < head.index('<script type="module"')  # before Gradio's modules
        assert length == len(page.encode())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=30) as reply:
            assert TRACKER_FRAMES_JS not in reply.read().decode()  # only the page itself
    finally:
        blocks.close()


def test_a_panel_that_answers_slowly_on_a_busy_machine_still_starts(monkeypatch):
    """Gradio's startup probe gave up at its first 3-second timeout and the panel refused to start (a CI run
    beside training processes on 2 cores); answers() waits, and ignores proxies set for the outside world."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gradio import networking

    from tunedeck.app.serving import answers

    class Slow(BaseHTTPRequestHandler):
        def do_HEAD(self):
            time.sleep(3.5)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        assert not networking.url_ok(url)  # why answers() exists
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        assert answers(url)
    finally:
        server.shutdown()
        server.server_close()
    assert not answers(url, wait_s=1)  # nothing answers now
