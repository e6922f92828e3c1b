"""Only the panel's own pages drive it: requests for another host name, and writes from another site, are refused.

Without --auth the panel trusts whoever reaches 127.0.0.1, and two kinds of web page could reach it from a
browser on the same machine (issue 32's attack probe):

- DNS rebinding: a page at http://evil.example:7860/ whose name is made to resolve to 127.0.0.1 after it
  loads is same-origin with itself, so it can read the panel's answers and press Start. Its requests carry
  `Host: evil.example:7860`. So a panel on a loopback address answers only to loopback names (and to the
  names given with --allowed-host, for a reverse proxy in front of it). The port is not compared: an SSH
  tunnel may map any local port to the panel's.
- Cross-site writes: any page can POST a form (an upload, a queue/join) to http://127.0.0.1:7860; the
  browser sends it with the visitor's cookies and an `Origin` header naming the page's site. A write (a
  method other than GET, HEAD or OPTIONS) or a websocket whose Origin is not the panel's own host and
  port (or an --allowed-host) is refused. A request without Origin is no browser's cross-site request
  (curl, the CLI) and passes; the opaque origin "null" (a sandboxed frame, a file:// page) does not.

A panel on another address needs --auth; its session cookie is not sent to a rebound name, so any Host is
answered there, and the Origin rule still stands.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse

LOOPBACK_HOST_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(authority: str) -> str:
    """'Example.com:7860' -> 'example.com'; '[::1]:7860' -> '::1'."""
    return (urlsplit(f"//{authority}").hostname or "").lower()


class RequestGate:
    """ASGI middleware (see the module docstring). `names`: the host names a request may ask for, or None for any;
    `allowed`: names a reverse proxy reaches the panel by (accepted as Host and as Origin)."""

    def __init__(self, app, names: frozenset[str] | None, allowed: frozenset[str] = frozenset()):
        self.app = app
        self.allowed = frozenset(name.lower() for name in allowed)
        self.names = None if names is None else frozenset(names) | self.allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        why = self.refusal(headers.get("host", ""), headers.get("origin"), scope["type"], scope.get("method", "GET"))
        if why is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await PlainTextResponse(why, status_code=403)(scope, receive, send)

    def refusal(self, host: str, origin: str | None, kind: str, method: str) -> str | None:
        """Why this request is refused, or None."""
        name = host_name(host)
        if self.names is not None and name not in self.names:
            return (
                f"tunedeck answers only to {', '.join(sorted(self.names))}, not to the host name {name or '(none)'!r}: "
                "a page elsewhere must not drive this panel. Reaching it through a reverse proxy by that name? "
                "Start it with --allowed-host NAME."
            )
        if origin is None or (kind == "http" and method in SAFE_METHODS):
            return None
        parts = urlsplit(origin)
        if origin != "null" and (parts.netloc.lower() == host.lower() or (parts.hostname or "") in self.allowed):
            return None
        return (
            f"tunedeck refused a write from another site ({origin[:100]}): only the panel's own page may change it. "
            "Behind a reverse proxy, start it with --allowed-host NAME."
        )
