"""A panel with --auth, probed as a stranger would: real `tunedeck ui` processes, real HTTP, Chromium.

Two panels share one TMPDIR (what /tmp is for them), so one can play "another panel" for the other.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from panel.browser import PanelServer, wait_text
from tunedeck.app.auth_gate import FAILURE_DELAY_S, OVERALL, PER_CLIENT


@pytest.fixture(scope="module")
def panels(tmp_path_factory, demo_home):
    temp = tmp_path_factory.mktemp("tmp")
    base = tmp_path_factory.mktemp("panels")
    env = {"TMPDIR": str(temp)}
    main = PanelServer(base / "runs-main", "--auth", "ann:s3cret", "--preset", "demo", env=env, wait=False)
    other = PanelServer(base / "runs-other", "--auth", "bob:other", env=env, wait=False)
    try:
        main.wait_ready()
        other.wait_ready()
        yield SimpleNamespace(main=main, other=other, temp=temp, demo=demo_home)
    finally:
        main.stop()
        other.stop()


def work_dir(server) -> Path:
    """The panel's own temporary folder, as it announces it."""
    return Path(re.search(r"temporary files in (\S+)", server.log()).group(1))


def fetch(url: str, method: str = "GET", opener=None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=20) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def sign_in(server, user: str, password: str):
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.parse.urlencode({"username": user, "password": password}).encode()
    assert opener.open(server.url + "login", data=form, timeout=20).status == 200
    return opener


def gradio_routes(runs_dir: Path) -> list[tuple[str, str]]:
    """(method, path) of every route the panel serves, read from the app Gradio builds for the page with the
    page's own routes added as app/serving.py adds them."""
    from gradio.routes import App

    from tunedeck.app.page import build_page

    def walk(routes, prefix=""):
        for route in routes:
            included = getattr(route, "include_context", None)
            if included is not None:  # an APIRouter included with its prefix (/gradio_api)
                yield from walk(included.included_router.routes, prefix + included.prefix)
            else:
                for method in getattr(route, "methods", None) or ["GET"]:
                    yield method, prefix + route.path

    page = build_page(runs_dir, "demo")
    return sorted(set(walk(App.create_app(page, app_kwargs={"routes": list(page.tunedeck_routes)}).routes)))


def test_nothing_of_the_app_reaches_a_client_before_sign_in(panels, tmp_path):
    server = panels.main
    own_file = work_dir(server) / "gradio" / "probe" / "bundle.zip"  # a file the panel itself serves
    own_file.parent.mkdir(parents=True)
    own_file.write_bytes(b"PK tunedeck bundle")
    secrets = [
        b"gradio_api_info",
        b"gradio_config",
        b"name_or_path",
        str(panels.demo).encode(),
        b"field-model",
        b"Llama",
        b"bundle",
    ]

    routes = gradio_routes(tmp_path / "runs")
    assert len(routes) > 80 and ("GET", "/gradio_api/heartbeat/{session_hash}") in routes
    assert ("GET", "/tunedeck/run-progress") in routes  # the page's own (app/live_progress.py)
    probed = []
    for method, path in routes:
        if path in ("/login", "/login/"):
            continue  # sign-in itself: see the throttling test
        url = re.sub(r"\{[^}]*path[^}]*\}", str(own_file), path)  # file=/..., proxy=..., assets/...
        url = re.sub(r"\{[^}]+\}", "x", url)
        status, body = fetch(server.url.rstrip("/") + url, method)
        probed.append((method, path, status))
        assert not any(secret in body for secret in secrets), (method, path, body[:300])
        if (method, path) in (("GET", "/"), ("HEAD", "/")):
            assert status == 200 and (method == "HEAD" or b'id="sign-in"' in body)
            assert len(body) < 5000
        elif path == "/gradio_api/startup-events":
            assert status == 200 and body in (b"true", b"false")  # Gradio's launch() calls it before anyone signs in
        else:
            assert status == 401, (method, path, status, body[:200])
    print(f"{len(probed)} routes probed without a session: {sum(s == 401 for *_, s in probed)} refused with 401")

    # Signed in, the same routes answer: the gate passes a session Gradio issued.
    opener = sign_in(server, "ann", "s3cret")
    status, body = fetch(server.url, opener=opener)
    assert status == 200 and b"gradio_api_info" in body
    assert fetch(f"{server.url}gradio_api/file={own_file}", opener=opener) == (200, b"PK tunedeck bundle")
    # The progress route takes a run id and nothing else: no path reaches the disk through it.
    for run in ("../../etc/passwd", "20250101-120000-a1b2c3/../x", "20250101-120000-a1b2c3"):
        status, body = fetch(f"{server.url}tunedeck/run-progress?run={urllib.parse.quote(run)}", opener=opener)
        assert status == 404 and b"error" in body and b"root:" not in body, (run, body)


def test_a_panel_serves_no_file_that_another_panel_or_the_machine_wide_cache_holds(panels):
    opener = sign_in(panels.main, "ann", "s3cret")
    machine_wide = (
        panels.temp / "gradio" / "probe" / "left-by-another-app.txt"
    )  # Gradio's default cache: $TMPDIR/gradio
    other_panels = work_dir(panels.other) / "gradio" / "probe" / "other-panel.txt"
    for path in (machine_wide, other_panels):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not yours")
    try:
        for path in (machine_wide, other_panels):
            status, body = fetch(f"{panels.main.url}gradio_api/file={path}", opener=opener)
            assert status == 403 and b"not yours" not in body, (path, status)
    finally:
        shutil.rmtree(panels.temp / "gradio")


@pytest.mark.browser
def test_sign_in_page_in_a_browser(panels, page):
    page.goto(panels.main.url)
    page.fill("#username", "ann")
    page.fill("#password", "wrong")
    page.click("#sign-in-button")
    wait_text(page, "#why", "Wrong user or password", timeout=30_000)
    assert page.evaluate("typeof window.gradio_api_info") == "undefined"
    page.fill("#password", "s3cret")
    page.click("#sign-in-button")
    page.wait_for_selector("#file-view .cm-content", timeout=60_000)
    wait_text(page, "#job-issues", "No problems", timeout=60_000)


def post_login(server, user: str, password: str, source: str, forwarded_for: str | None = None) -> SimpleNamespace:
    """POST /login from the loopback address `source` (127.0.0.0/8 all reach a server on 127.0.0.1)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30, source_address=(source, 0))
    started = time.monotonic()
    try:
        body = urllib.parse.urlencode({"username": user, "password": password})
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if forwarded_for:
            headers["X-Forwarded-For"] = forwarded_for
        connection.request("POST", "/login", body, headers)
        response = connection.getresponse()
        return SimpleNamespace(
            status=response.status,
            body=response.read().decode(),
            retry=response.getheader("Retry-After"),
            seconds=time.monotonic() - started,
        )
    finally:
        connection.close()


def test_failed_sign_ins_are_slowed_and_limited_per_client_and_a_swarm_locks_no_one_out(panels):
    server = panels.other  # its throttle state is its own: the other tests keep signing in to `main`
    answers: list[SimpleNamespace] = []

    def guess(worker: int) -> None:  # one address guessing as fast as it can, 4 connections at a time
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            answers.append(post_login(server, "bob", f"guess-{worker}-{len(answers)}", "127.0.0.2"))

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    checked = [a for a in answers if a.status == 400]
    refused = [a for a in answers if a.status == 429]
    print(
        f"one address, 3 s: {len(answers)} wrong passwords sent, {len(checked)} checked, {len(refused)} refused unchecked"
    )
    assert len(checked) == PER_CLIENT and len(refused) == len(answers) - PER_CLIENT
    assert min(a.seconds for a in checked) >= FAILURE_DELAY_S * 0.95  # every failure is answered late
    assert "try again in" in refused[0].body and int(refused[0].retry) > 0
    # The right password from the throttled address waits too: no more guesses until the window moves on.
    assert post_login(server, "bob", "other", "127.0.0.2").status == 429
    assert post_login(server, "bob", "other", "127.0.0.3").status == 200  # another client is not held up

    # X-Forwarded-For from a loopback peer is no new client (uvicorn believed it by default: rotating it
    # bought a guesser unlimited tries).
    rotating = [post_login(server, "bob", "x", "127.0.0.5", forwarded_for=f"10.9.0.{n}") for n in range(PER_CLIENT + 1)]
    assert [a.status for a in rotating] == [400] * PER_CLIENT + [429]

    # A swarm of addresses, one guess each: all are checked (each address once), and the right password from
    # an address that has not failed still gets in; it used to be refused for everyone after OVERALL failures.
    swarm: list[SimpleNamespace] = []
    threads = [
        threading.Thread(target=lambda n=n: swarm.append(post_login(server, "bob", "x", f"127.0.1.{n}")))
        for n in range(1, OVERALL + 11)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status for a in swarm] == [400] * (OVERALL + 10)
    assert post_login(server, "bob", "x", "127.0.1.1").status == 429  # the window is crowded: one try each
    assert post_login(server, "bob", "other", "127.0.2.1").status == 200


@pytest.mark.slow  # a panel started and stopped twice
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_panel_removes_its_temporary_files(how, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    server = PanelServer(tmp_path / "runs", env={"TMPDIR": str(temp)})
    try:
        folder = work_dir(server)
        assert folder.parent == temp and [p.name for p in temp.iterdir()] == [folder.name]
        assert urllib.request.urlopen(server.url, timeout=20).status == 200
        (folder / "gradio" / "probe").mkdir(parents=True, exist_ok=True)  # as a download the page offered
        (folder / "gradio" / "probe" / "bundle.zip").write_bytes(b"PK")
    finally:
        server.stop(how)
    assert server.proc.returncode == 0, server.log()
    assert list(temp.iterdir()) == []  # no panel folder, no bundles, no machine-wide gradio cache


@pytest.mark.slow  # a panel started and stopped twice
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_panel_with_a_live_runs_bar_streaming_stops_at_once(how, tmp_path):
    """A page on a live run keeps its bar's stream open (app/live_progress.py): stopping the panel ends it first
    (Gradio's stop event), where the server alone would wait 5 s for it before giving up."""
    import subprocess
    import sys

    from runs.helpers import fake_run

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the run's supervisor
    server = PanelServer(tmp_path / "runs")
    try:
        fake_run(tmp_path / "runs", "20250101-120000-a1b2c3", "running", holder)
        stream = urllib.request.urlopen(f"{server.url}tunedeck/run-progress?run=20250101-120000-a1b2c3", timeout=20)
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert b'"live": true' in stream.readline()
        began = time.monotonic()
        server.stop(how)
        took = time.monotonic() - began
    finally:
        server.stop()
        holder.kill()
        holder.wait()
    assert server.proc.returncode == 0 and took < 4, (took, server.log())
