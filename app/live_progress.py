"""A live run's progress line, streamed to the page between Gradio events.

Every Gradio event costs the browser far more than its answer (an empty tick of the Run tab: about
60 ms of Chromium's CPU, bench/bench_run_tab.py), and on a machine that also trains, that CPU is taken
from the run. So the Run tab's Gradio timer ticks every 5 s (run_shown.TICK_S) for the state line,
charts and log, and the progress bar (step, elapsed time, ETA) follows the run through one
server-sent event stream: the panel looks at the run every POLL_S and sends the bar when it changed,
and the page writes it (a text and a width). A stream, not a poll: a fetch every half second cost
the browser as much as the rest of the tab. The stream also says the run's state: when it
changes (queued -> running, the run ended), the page presses the Run tab's hidden refresh button
(REFRESH_ID), so the page shows the change at once, not at the next tick; a run that ended ends
its stream. The route sits behind the same sign-in gate as every other route (app/auth_gate.py) and
takes only a run id, which the run manager checks. FOLLOW_LOG_JS, the other page-side script of a
live run, keeps the log's newest lines in view.
"""

from __future__ import annotations

import json
import time

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tunedeck.app.run_state_line import progress_bar
from tunedeck.app.run_watch import RunWatches
from tunedeck.backend.runs import RunError, RunManager, live_phase, summarize

PATH = "/tunedeck/run-progress"
REFRESH_ID = "run-refresh"  # the Run tab's hidden button that the page presses (run_view.py)
POLL_S = 0.5  # a new metrics record reaches the page within a second (bench/bench_panel.py)
KEEPALIVE_S = 15  # a comment line now and then, so that proxies and tunnels keep a quiet stream open


def run_progress(manager: RunManager, watches: RunWatches, run_id: str) -> dict:
    """The bar of `run_id` now: {run, width, color, text, live, state}; RunError for an id that is not a run."""
    status = manager.status(run_id)
    watch = watches.get(manager.run_dir(run_id))
    watch.refresh()
    summary = summarize(
        watch, status.started_at, status.ended_at, phase=live_phase(watch.run_dir, watch, status.ended_at)
    )
    return {"run": run_id, **progress_bar(summary.fraction, summary.progress, status.state)}


def progress_route(manager: RunManager, watches: RunWatches) -> Route:
    async def answer(request: Request):
        run_id = request.query_params.get("run", "")
        try:  # file reads: off the event loop
            bar = await anyio.to_thread.run_sync(run_progress, manager, watches, run_id)
        except RunError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        return StreamingResponse(
            _events(request, bar, lambda: run_progress(manager, watches, run_id)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return Route(PATH, answer, methods=["GET"])


async def _events(request: Request, bar: dict, look):
    """The bar now, then each change of it, until the run ends or the page goes away."""
    sent, sent_at = None, 0.0
    while True:
        if bar != sent:
            yield f"data: {json.dumps(bar)}\n\n"
            sent, sent_at = bar, time.monotonic()
        elif time.monotonic() - sent_at >= KEEPALIVE_S:
            yield ": still here\n\n"
            sent_at = time.monotonic()
        if not bar["live"]:
            return
        await anyio.sleep(POLL_S)
        if _closing(request) or await request.is_disconnected():
            return
        try:
            bar = await anyio.to_thread.run_sync(look)
        except RunError:  # the run's folder went away
            return


def _closing(request: Request) -> bool:
    """The panel is shutting down: Gradio sets its app's stop event first (its own streams end on it), and the
    server waits for every open response before it exits (5 s more with a stream left open)."""
    stop = getattr(request.app, "stop_event", None)
    return stop is not None and stop.is_set()


# Runs once when the page loads. Every second it checks which live run's bar is in view (the Run tab
# shown, the browser tab visible) and keeps one stream open for it, none otherwise; each message
# rewrites the bar in place (the next Gradio tick's bar replaces the element: the message finds the
# new one). A new state presses the refresh button once; an ended run's stream is closed for good.
POLL_JS = f"""
() => {{
  let source = null, streamed = null;
  const close = () => {{ if (source) source.close(); source = null; streamed = null; }};
  const liveBar = () => {{
    const box = document.querySelector('#run-progress .td-progress[data-live="1"]');
    return box && !document.hidden && box.offsetParent !== null ? box : null;
  }};
  const follow = () => {{
    const box = liveBar(), run = box ? box.dataset.run : null;
    if (run === streamed && source && source.readyState !== EventSource.CLOSED) return;
    close();
    if (!run) return;
    streamed = run;
    source = new EventSource('{PATH.lstrip("/")}?run=' + encodeURIComponent(run));
    source.onmessage = (message) => {{
      const bar = JSON.parse(message.data);
      const box = document.querySelector('#run-progress .td-progress');
      if (!box || box.dataset.run !== bar.run) return;
      const fill = box.querySelector('.td-progress-fill');
      fill.style.width = bar.width;
      fill.style.background = bar.color;
      box.querySelector('.td-progress-text').textContent = bar.text;
      box.dataset.live = bar.live ? '1' : '0';
      if (!bar.live) close();  // its stream ends here: no reconnection
      if (bar.state !== box.dataset.state) {{
        box.dataset.state = bar.state;
        document.getElementById('{REFRESH_ID}')?.click();
      }}
    }};
  }};
  setInterval(follow, 1000);
  document.addEventListener('visibilitychange', follow);
}}
"""


# Scrolls the log to its end after each update, unless the reader scrolled up (then it stays put
# until they scroll back down). Browser-side only: no server round trip.
FOLLOW_LOG_JS = """
() => setTimeout(() => {
  const box = document.querySelector('#run-log textarea');
  if (!box) return;
  if (box.dataset.follow === undefined) {
    box.dataset.follow = '1';
    box.addEventListener('scroll', () => {
      box.dataset.follow = box.scrollTop + box.clientHeight >= box.scrollHeight - 24 ? '1' : '0';
    });
  }
  if (box.dataset.follow === '1') box.scrollTop = box.scrollHeight;
}, 50)
"""
