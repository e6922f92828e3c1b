"""Two costs Gradio 6.31 pays while nothing happens, taken back (measured: bench/bench_panel.py).

1. Its queue looks for work every 1 ms when it has none (gradio/queueing.py, `sleep_when_free`):
   0.08 of a core of the panel process with no page open (strace: 1,600 epoll waits a second).
   50 ms, Gradio's own value on Windows, delays an event by at most that.
2. Its StatusTracker counts a pending event's seconds with requestAnimationFrame, and the page's
   loading-screen tracker is destroyed while still "pending", so that loop never stops: 60 frames
   a second for as long as the page is open, 0.08-0.1 of a Chromium core on every tab, while the
   run trains on the same machine. A script placed before Gradio's own (the page's <head>) gives
   the trackers a requestAnimationFrame that runs on a plain 100 ms timer: their text shows tenths
   of a second, and the orphaned loop no longer makes the browser draw a frame.

And one it pays at every event: its page keeps a loading status for each progress target of every
event that ever ran (its outputs, unless `show_progress_on` names others) and, at each later event,
updates all of them (`update_loading_stati_state`, copying each one's value): with the page load's
and the timers' outputs that is most of the page, 0.1 s of the browser per tick of the Run tab.
`narrow_progress_targets` gives each event that shows no progress one small target instead.
"""

from __future__ import annotations

QUEUE_IDLE_POLL_S = 0.05  # Gradio's value on Windows
QUEUE_PROGRESS_POLL_S = 0.1  # likewise, for gr.Progress updates

# Gradio's trackers live in an asset named statustracker-<hash>.js, which keeps
# window.requestAnimationFrame as it finds it when loaded (and never cancels a frame): a caller
# from that file gets a timer instead.
TRACKER_FRAMES_JS = """(() => {
  const frame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) =>
    /statustracker/.test(new Error().stack || "")
      ? window.setTimeout(() => callback(performance.now()), 100)
      : frame(callback);
})();"""


def narrow_progress_targets(blocks, target) -> None:
    """Events that show no progress (show_progress="hidden") report their loading status to `target`
    alone, not to each of their outputs (see above): call it once the page is wired."""
    for event in blocks.fns.values():
        if event.show_progress == "hidden" and event.show_progress_on is None:
            event.show_progress_on = [target]


def calm_queue(blocks) -> None:
    """Slow the launched page's idle queue poll (point 1 above)."""
    blocks._queue.sleep_when_free = QUEUE_IDLE_POLL_S
    blocks._queue.progress_update_sleep_when_free = QUEUE_PROGRESS_POLL_S


class HeadScript:
    """ASGI middleware: the page at `/` gets `script` first in its <head>, before Gradio's modules run."""

    def __init__(self, app, script: str = TRACKER_FRAMES_JS):
        self.app = app
        self.tag = b"<script>" + script.encode() + b"</script>"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != "/":
            return await self.app(scope, receive, send)
        start: dict = {}
        body = bytearray()

        async def hold(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                return await send(message)
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            page = self._with_script(start, bytes(body))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, hold)

    def _with_script(self, start: dict, page: bytes) -> bytes:
        html = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in start.get("headers", []))
        if not html or b"<head>" not in page:
            return page
        return page.replace(b"<head>", b"<head>" + self.tag, 1)
