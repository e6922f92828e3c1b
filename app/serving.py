"""Serving the panel safely: loopback by default, a password required anywhere else.

The panel starts training jobs and reads files on the machine it runs on, so whoever
can reach it can use the GPUs. Bound to 127.0.0.1 only this machine's users (or an SSH
tunnel) reach it; on any other address it refuses to start without --auth/--auth-file.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class ServingError(ValueError):
    """A refused serving setup; the message says why and what to do instead."""


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to a public address, so treat it as exposed


def parse_credentials(auth: str | None = None, auth_file: str | Path | None = None) -> list[tuple[str, str]] | None:
    """USER:PASS, or a file of USER:PASS lines (# comments, blank lines ignored) -> credential pairs."""
    lines: list[tuple[str, str]] = []
    if auth:
        lines.append(("--auth", auth))
    if auth_file:
        path = Path(auth_file)
        if not path.is_file():
            raise ServingError(f"--auth-file {path}: no such file")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append((f"{path}:{number}", line.strip()))
    if not lines:
        return None
    pairs = []
    for where, text in lines:
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise ServingError(f"{where}: expected USER:PASS with both parts non-empty")
        pairs.append((user, password))
    return pairs


def check_exposure(host: str, credentials: list[tuple[str, str]] | None) -> None:
    if is_loopback(host) or credentials:
        return
    raise ServingError(
        f"refusing to serve on {host} without a password: anyone who can reach this address could start "
        "jobs on this machine's GPUs and read its files. Either add --auth USER:PASS (or --auth-file FILE), "
        "or keep the default --host 127.0.0.1 and reach the panel through an SSH tunnel: "
        "ssh -L 7860:127.0.0.1:7860 <this-server>, then open http://127.0.0.1:7860."
    )


# Training data comes through the page (⬆ Upload data, kept under the runs folder); the job.yaml upload has its own cap.
MAX_UPLOAD = "4gb"
AUTH_MESSAGE = "Sign in with the user and password given to `tunedeck ui --auth`."


def answers(url: str, wait_s: float = 60.0) -> bool:
    """Whether the panel just started at `url` answers from this machine within `wait_s` seconds.

    Gradio's own probe (gradio.networking.url_ok) gives up at the first 3-second timeout, and a panel started
    beside runs that keep every core busy answered later than that: it refused to start, asking for share=True.
    Proxies from the environment are not used: the panel is asked from the machine it runs on.
    """
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            status = httpx.head(url, timeout=10, verify=False, trust_env=False).status_code
            if status < 400 or status == 401:  # 401: behind --auth
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


@contextmanager
def patient_startup_probe() -> Iterator[None]:
    """Gradio's launch() asks gradio.networking.url_ok; answers() waits for a busy machine instead."""
    from gradio import networking

    impatient = networking.url_ok
    networking.url_ok = answers
    try:
        yield
    finally:
        networking.url_ok = impatient


def launch(
    page,
    host: str,
    port: int,
    credentials: list[tuple[str, str]] | None,
    block: bool = True,
    allowed_hosts: Sequence[str] = (),
    trusted_proxies: Sequence[str] = (),
):
    """Serve `page`; no tracebacks in responses (show_error=False), small uploads only.

    Requests for another host name or writes from another site are refused (app/request_gate.py;
    `allowed_hosts`: the names a reverse proxy reaches the panel by). With credentials every route sits
    behind app/auth_gate.py's SignInGate (Gradio's own checks leave some routes open), and passwords are
    compared in constant time. X-Forwarded-For is believed only from `trusted_proxies`: uvicorn believes it
    from any loopback peer by default, so one client rotating it looked like many to the sign-in throttle.
    """
    import gradio.themes
    from starlette.middleware import Middleware

    from tunedeck.app.auth_gate import SignInGate, password_checker
    from tunedeck.app.idle_costs import HeadScript, calm_queue
    from tunedeck.app.request_gate import LOOPBACK_HOST_NAMES, RequestGate

    check_exposure(host, credentials)
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(trusted_proxies)  # read by uvicorn.Config in launch() below
    names = LOOPBACK_HOST_NAMES if is_loopback(host) else None
    app_kwargs: dict = {
        "routes": list(getattr(page, "tunedeck_routes", [])),  # the page's own (live_progress.py)
        "middleware": [
            Middleware(RequestGate, names=names, allowed=frozenset(allowed_hosts)),
            Middleware(HeadScript),  # idle_costs.py
        ],
    }
    if credentials:
        app_kwargs["middleware"].insert(1, Middleware(SignInGate, message=AUTH_MESSAGE))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own startup probes
    with patient_startup_probe():
        app = page.launch(
            server_name=host,
            server_port=port,
            auth=password_checker(credentials) if credentials else None,
            auth_message=AUTH_MESSAGE,
            app_kwargs=app_kwargs,
            show_error=False,
            ssr_mode=False,
            max_file_size=MAX_UPLOAD,
            footer_links=[],
            prevent_thread_lock=True,
            theme=getattr(page, "tunedeck_theme", None) or gradio.themes.Soft(),
            css=getattr(page, "tunedeck_css", None),
            js=getattr(page, "tunedeck_js", None),
            quiet=True,
        )
    calm_queue(page)
    where = f"[{host}]" if ":" in host else host
    print(f"tunedeck: the panel is at http://{where}:{port}/  (Ctrl-C stops the panel; runs keep going)", flush=True)
    if is_loopback(host):
        print(
            f"tunedeck: from another machine: ssh -L {port}:127.0.0.1:{port} <this-server>, then open that address",
            flush=True,
        )
    while block and page.is_running:  # Gradio's block_thread(), less its Ctrl-C handling (app/cli_ui.py's)
        time.sleep(0.1)
    return app
