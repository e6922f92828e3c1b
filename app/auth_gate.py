"""The sign-in gate in front of the whole panel: nothing of the app reaches a client before sign-in.

Gradio 6.31 checks the login route by route, and not on all of them (gradio/routes.py): `/`
and `/gradio_api/runs` embed the page's whole API description (`window.gradio_api_info`,
518 KB, with the form's default values and, under --preset demo, local model and data
paths), and /theme.css, /manifest.json, /gradio_api/heartbeat/*, /gradio_api/startup-events,
/gradio_api/app_id, /monitoring/* and the static assets answer anyone. So this ASGI
middleware refuses by default instead of following that list: without a session Gradio
issued (its own token cookie), a client gets a small sign-in page at `/`, may POST /login,
and gets 401 for everything else.

Sign-ins are throttled (about 1,000 wrong passwords a second got an answer before): every
failure is answered after FAILURE_DELAY_S, and a client with PER_CLIENT failures in the last
WINDOW_S seconds is refused unchecked (429, with Retry-After) until the window moves on: a
guesser gets 5 tries a minute. Once OVERALL failures happened in the window (a swarm of
addresses), a client gets one try a window instead of five, but a client that has not failed
is always checked: a swarm no longer locks the right password out for everyone, as a global
limit did (issue 32). The client is the connection's peer: X-Forwarded-For counts only from a
proxy given with --trusted-proxy (app/serving.py), or rotating it made one guesser many.
Passwords are compared in constant time (password_checker).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import time
from collections import deque
from html import escape

from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, JSONResponse

FAILURE_DELAY_S = 1.0
PER_CLIENT = 5
OVERALL = 20
WINDOW_S = 60.0
# Gradio's launch() calls this itself before anyone signs in (gradio/blocks.py); it starts the
# queue once and answers true or false, nothing else.
OPEN_TO_ALL = {("GET", "/gradio_api/startup-events")}


def password_checker(credentials: list[tuple[str, str]]):
    """(user, password) -> bool for Gradio's `auth`, in the same time whichever part is wrong.

    Both sides are hashed (equal lengths, so compare_digest leaks no length) and every pair is
    compared without short-circuit: an unknown user costs what a wrong password costs.
    """

    def digest(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    known = [(digest(user), digest(password)) for user, password in credentials]

    def check(user: str, password: str) -> bool:
        user_d, password_d = digest(user), digest(password)
        ok = False
        for known_user, known_password in known:
            ok |= hmac.compare_digest(user_d, known_user) & hmac.compare_digest(password_d, known_password)
        return ok

    return check


class LoginThrottle:
    """Failed sign-ins in a sliding window, per client (and fewer per client while the window is crowded).

    Used from the event loop only (the middleware), so it needs no lock. An attempt counts as a
    failure from the moment it is let through, so a burst of parallel requests cannot all pass
    the check before the first one fails; a success forgets the client's failures.
    """

    def __init__(
        self, per_client: int = PER_CLIENT, overall: int = OVERALL, window_s: float = WINDOW_S, clock=time.monotonic
    ):
        self.per_client, self.overall, self.window_s, self.clock = per_client, overall, window_s, clock
        self._failures: deque[tuple[float, str]] = deque()  # (when, client), oldest first

    def begin(self, client: str) -> float:
        """0 to let the attempt through (it counts as a failure until succeeded()); else seconds to wait."""
        now = self.clock()
        while self._failures and self._failures[0][0] <= now - self.window_s:
            self._failures.popleft()
        mine = [when for when, who in self._failures if who == client]
        allowed = 1 if len(self._failures) >= self.overall else self.per_client  # a swarm: one try each
        if len(mine) >= allowed:
            return mine[0] + self.window_s - now
        self._failures.append((now, client))
        return 0.0

    def succeeded(self, client: str) -> None:
        self._failures = deque(f for f in self._failures if f[1] != client)


def signed_in(scope) -> bool:
    """Does the request carry a session that Gradio issued at /login (its own cookies and token table)?"""
    gradio_app = scope["app"]
    cookies = HTTPConnection(scope).cookies
    token = cookies.get(f"access-token-{gradio_app.cookie_id}") or cookies.get(
        f"access-token-unsecure-{gradio_app.cookie_id}"
    )
    return token is not None and token in gradio_app.tokens


class SignInGate:
    """ASGI middleware: Gradio's app behind it is reached only with a session (see the module docstring)."""

    def __init__(self, app, message: str = "", throttle: LoginThrottle | None = None):
        self.app = app
        self.page = SIGN_IN_PAGE.replace("{message}", escape(message))
        self.throttle = throttle or LoginThrottle()

    async def __call__(self, scope, receive, send) -> None:
        method, path = scope.get("method", ""), scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or (method, path) in OPEN_TO_ALL or signed_in(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        if method == "POST" and path in ("/login", "/login/"):
            return await self._login(scope, receive, send)
        if method in ("GET", "HEAD") and path == "/":
            response = HTMLResponse(self.page, headers={"Cache-Control": "no-store"})
        else:
            response = JSONResponse({"detail": "Not signed in: open / to sign in."}, status_code=401)
        await response(scope, receive, send)

    async def _login(self, scope, receive, send) -> None:
        client = (scope.get("client") or ("unknown",))[0]
        wait_s = self.throttle.begin(client)
        if wait_s:
            seconds = math.ceil(wait_s)
            response = JSONResponse(
                {"detail": f"Too many failed sign-ins: try again in {seconds} s."},
                status_code=429,
                headers={"Retry-After": str(seconds)},
            )
            return await response(scope, receive, send)

        async def answer(message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 200:
                    self.throttle.succeeded(client)
                else:  # a wrong password (or a malformed form) is answered late: no fast guessing
                    await asyncio.sleep(FAILURE_DELAY_S)
            await send(message)

        await self.app(scope, receive, answer)


SIGN_IN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>tunedeck · sign in</title>
<style>
  body { font-family: system-ui, sans-serif; background: #f8fafc; color: #1f2937; display: grid; place-items: center; min-height: 90vh; }
  form { background: white; padding: 2em; border-radius: 12px; box-shadow: 0 2px 12px #0002; width: 20em; }
  label { display: block; margin-top: 1em; font-size: 0.9em; }
  input { width: 100%; box-sizing: border-box; padding: 0.5em; margin-top: 0.3em; border: 1px solid #cbd5e1; border-radius: 6px; }
  button { margin-top: 1.5em; width: 100%; padding: 0.6em; border: 0; border-radius: 6px; background: #4f46e5; color: white; font-size: 1em; }
  #why { color: #dc2626; min-height: 1.5em; margin-top: 1em; font-size: 0.9em; }
</style></head>
<body><form id="sign-in">
  <h2>tunedeck</h2><p>{message}</p>
  <label>User <input name="username" id="username" autocomplete="username" required autofocus></label>
  <label>Password <input name="password" id="password" type="password" autocomplete="current-password" required></label>
  <button type="submit" id="sign-in-button">Sign in</button>
  <div id="why" role="alert"></div>
</form>
<script>
document.getElementById("sign-in").addEventListener("submit", async (event) => {
  event.preventDefault();
  const why = document.getElementById("why");
  why.textContent = "Checking...";
  const response = await fetch("login", {method: "POST", body: new URLSearchParams(new FormData(event.target))});
  if (response.ok) { location.reload(); return; }
  const body = await response.json().catch(() => ({}));
  why.textContent = response.status === 429 ? body.detail : "Wrong user or password.";
});
</script></body></html>
"""
