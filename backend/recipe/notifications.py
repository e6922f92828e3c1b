"""How the run ended, POSTed to $TUNEDECK_NOTIFY_URL (a Slack, Discord or Teams webhook, or any endpoint), escaped as
the service reads it and bounded in time.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
from pathlib import Path

from .records import METRICS_FILE, last_record

NOTIFY_ENV = "TUNEDECK_NOTIFY_URL"


# The whole POST (connecting, sending, the answer): urllib's timeout bounds each socket read alone, and a webhook
# answering a byte a second held a finished run open for ever.
NOTIFY_DEADLINE_S = 10


def notify_target() -> tuple[str, str] | None:
    """(URL, its host) from $TUNEDECK_NOTIFY_URL, None when unset; ValueError when it is not an http(s) URL.
    Only the host is ever printed: the rest of a webhook URL, and a user:password@ in it, is its secret."""
    import urllib.parse

    url = os.environ.get(NOTIFY_ENV, "").strip()
    if not url:
        return None
    where = urllib.parse.urlsplit(url)
    if where.scheme not in ("http", "https") or not where.hostname:
        raise ValueError(f"{NOTIFY_ENV} is not an http(s) URL: no notification will be sent")
    return url, where.hostname


def notify(run_dir: Path, status: str, error: str | None, runtime_s: float) -> None:
    """POST how the run ended to $TUNEDECK_NOTIFY_URL, once, within NOTIFY_DEADLINE_S; never fails the run (a warning
    in the log instead). The caller has recorded the run's end before: whatever the webhook does comes after."""
    try:
        target = notify_target()
    except ValueError as exc:
        print(f"warning: {exc}", file=sys.stderr, flush=True)
        return
    if target is None:
        return
    url, host = target
    last = _last_loss_record(run_dir / METRICS_FILE)
    health = last_record(run_dir / METRICS_FILE, lambda record: record.get("event") == "health")
    body = notification(run_dir.name, status, error, runtime_s, last, webhook_service(url), health)
    problem = post_within(url, body, NOTIFY_DEADLINE_S)
    if problem:  # the URL's path may hold its secret: only its host is named
        print(f"warning: the notification to {host} failed: {problem}", file=sys.stderr, flush=True)


# Each chat service's webhook, by its host or (behind a proxy, or a local stand-in) by the shape of its path.
WEBHOOK_SERVICES = (
    ("slack", re.compile(r"^hooks\.slack\.com$"), re.compile(r"^/services/T[\w-]+/B[\w-]+/[\w-]+$")),
    ("discord", re.compile(r"^(?:\w+\.)?discord(?:app)?\.com$"), re.compile(r"^/api/webhooks/\d+/[\w-]+$")),
    ("teams", re.compile(r"^(?:[\w-]+\.webhook\.office\.com|outlook\.office\.com)$"), re.compile(r"^/webhookb2/")),
)


def webhook_service(url: str) -> str | None:
    """ "slack", "discord" or "teams" when the URL is that service's incoming webhook; None for any other endpoint."""
    import urllib.parse

    where = urllib.parse.urlsplit(url)
    host = (where.hostname or "").lower()
    return next((name for name, hosts, paths in WEBHOOK_SERVICES if hosts.match(host) or paths.match(where.path)), None)


def notification(
    run: str,
    status: str,
    error: str | None,
    runtime_s: float,
    last: dict | None,
    service: str | None,
    health: dict | None = None,
) -> dict:
    """The JSON a webhook gets: one line of text, and the facts as fields. The text carries the run's error, which
    may hold anything (a data file's name, a reward's output): it is escaped as the service reads it, so that no
    `<!channel>`, `@everyone` or link in it pings a channel or hides where it leads."""
    minutes, seconds = divmod(int(runtime_s), 60)
    text = f"tunedeck run {run} {status} after {minutes // 60}:{minutes % 60:02d}:{seconds:02d}"
    loss = last["loss"] if last and math.isfinite(last["loss"]) else None  # JSON has no NaN
    if last:
        text += f" · step {last['step']}/{last.get('max_steps', '?')} · loss {last['loss']:.4f}"
    # The health guard's finding (training.health): a run that finished with it is suspect; a stop says it itself.
    unhealthy = str(health.get("line")) if health and health.get("action") == "warned" else None
    text += f" · {unhealthy}" if unhealthy else ""
    text += f" · {error[:500]}" if error else ""
    text = WEBHOOK_ESCAPES.get(service or "", str)(text)
    body = {
        "text": text,  # Slack, Teams and most webhooks show "text"; Discord shows "content"
        "content": text[:2000],  # Discord's limit
        "run": run,
        "state": status,
        "step": last and last["step"],
        "max_steps": last and last.get("max_steps"),
        "loss": loss,
        "unhealthy": unhealthy,
        "error": error,
        "runtime_s": round(runtime_s, 1),
    }
    if service == "discord":
        # https://discord.com/developers/docs/resources/webhook#execute-webhook: allowed_mentions with an empty
        # "parse" pings nobody whatever the content says (resources/message#allowed-mentions-object); flags 4 is
        # SUPPRESS_EMBEDS, one of the two flags a webhook may set: no preview of a link in the error.
        body.update(allowed_mentions={"parse": []}, flags=4)
    return body


def slack_text(text: str) -> str:
    """Slack reads &, < and > as control characters in a message's text (<!channel>, <@U123>, <https://x|a link>) and
    asks for exactly those three as HTML entities, nothing else encoded:
    https://api.slack.com/reference/surfaces/formatting#escaping"""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


DISCORD_MARKDOWN = re.compile(r"([\\*_~`|>#\-\[\]()<@])")


def discord_text(text: str) -> str:
    """Discord's message markdown (https://support.discord.com/hc/en-us/articles/210298617): a backslash before a
    markdown character shows it as itself, so no [text](url) masks a link, no <@id> or <#id> mentions, no heading or
    quote. Pings are off by allowed_mentions as well (notification)."""
    return DISCORD_MARKDOWN.sub(r"\\\1", text)


TEAMS_MARKDOWN = re.compile(r"([\\*_~`#\-+!|\[\]()])")


def teams_text(text: str) -> str:
    """A Teams incoming webhook's card text takes Markdown and a subset of HTML
    (https://learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/cards-format): HTML's &, < and >
    as entities, and a backslash before each Markdown character, so no tag, [text](url) link or image renders."""
    return TEAMS_MARKDOWN.sub(r"\\\1", slack_text(text))


WEBHOOK_ESCAPES = {"slack": slack_text, "discord": discord_text, "teams": teams_text}


def post_within(url: str, body: dict, deadline_s: float) -> str | None:
    """POST `body` as JSON, all of it (connecting, sending, the answer) within deadline_s; the problem, or None.

    urllib's timeout bounds each socket read alone, so the POST runs in a thread of its own, left behind when the
    deadline passes (a daemon thread: it ends with the process). A user:password@ in the URL becomes HTTP basic
    auth: urllib takes no credentials from a URL (http.client reads "pass@host" as the port)."""
    import base64
    import urllib.parse
    import urllib.request

    where = urllib.parse.urlsplit(url)
    headers = {"Content-Type": "application/json", "User-Agent": "tunedeck"}
    if where.username is not None:
        login = f"{urllib.parse.unquote(where.username)}:{urllib.parse.unquote(where.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode("ascii")
        url = urllib.parse.urlunsplit(where._replace(netloc=where.netloc.rpartition("@")[2]))
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    outcome: list[str | None] = []

    def post() -> None:
        try:
            urllib.request.urlopen(request, timeout=deadline_s).close()
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is a warning: the run's end is recorded
            outcome.append(str(exc) or type(exc).__name__)

    thread = threading.Thread(target=post, name="tunedeck-notify", daemon=True)
    thread.start()
    thread.join(deadline_s)
    return outcome[0] if outcome else f"no whole answer within {deadline_s:g} s"


def _last_loss_record(path: Path) -> dict | None:
    """The newest log record with a training loss, from the end of metrics.jsonl."""
    return last_record(path, lambda record: record.get("event") == "log" and "loss" in record)
