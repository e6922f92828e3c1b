"""A live run's progress line, polled by a few lines of page JS instead of Gradio events.

Every Gradio event costs the browser far more than its answer (an empty tick of the Run tab: about
60 ms of Chromium's CPU, bench/bench_run_tab.py), and on a machine that also trains, that CPU is taken
from the run. So the Run tab's Gradio timer ticks every 5 s (run_view.TICK_S) for the state line,
charts and log, and the progress bar (step, elapsed time, ETA) follows the run every POLL_S through
one small JSON route: a fetch and two DOM writes. The route also says the run's state: when it
changes (queued -> running, the run ended), the poller presses the Run tab's hidden refresh button
(REFRESH_ID), so the page shows the change at once, not at the next tick. The route sits
behind the same sign-in gate as every other route (app/auth_gate.py) and takes only a run id, which
the run manager checks. FOLLOW_LOG_JS, the other page-side script of a live run, keeps the log's
newest lines in view.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tunedeck.app.run_state_line import progress_bar
from tunedeck.app.run_watch import RunWatches
from tunedeck.backend.run_summary import summarize
from tunedeck.backend.runs import RunError, RunManager

PATH = "/tunedeck/run-progress"
REFRESH_ID = "run-refresh"  # the Run tab's hidden button that the poller presses (run_view.py)
POLL_S = 0.5  # a new metrics record reaches the page within a second (bench/bench_panel.py)


def run_progress(manager: RunManager, watches: RunWatches, run_id: str) -> dict:
    """The bar of `run_id` now: {run, width, color, text, live, state}; RunError for an id that is not a run."""
    status = manager.status(run_id)
    watch = watches.get(manager.run_dir(run_id))
    watch.refresh()
    summary = summarize(watch, status.started_at, status.ended_at)
    return {"run": run_id, **progress_bar(summary.fraction, summary.progress, status.state)}


def progress_route(manager: RunManager, watches: RunWatches) -> Route:
    def answer(request: Request) -> JSONResponse:  # sync: Starlette runs it in its thread pool
        try:
            return JSONResponse(run_progress(manager, watches, request.query_params.get("run", "")))
        except RunError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)

    return Route(PATH, answer, methods=["GET"])


# Runs once when the page loads. While a live run's bar is in view (the Run tab shown, the browser
# tab visible), fetch its progress every POLL_S and write the bar's width and text; a new state
# presses the refresh button once. The next Gradio tick's bar replaces the element, and the
# poller picks up the new one.
POLL_JS = f"""
() => {{
  let busy = false;
  setInterval(async () => {{
    const box = document.querySelector('#run-progress .td-progress[data-live="1"]');
    if (busy || document.hidden || !box || box.offsetParent === null) return;
    busy = true;
    try {{
      const reply = await fetch('{PATH.lstrip("/")}?run=' + encodeURIComponent(box.dataset.run));
      const bar = reply.ok ? await reply.json() : null;
      if (bar && box.isConnected && box.dataset.run === bar.run) {{
        const fill = box.querySelector('.td-progress-fill');
        fill.style.width = bar.width;
        fill.style.background = bar.color;
        box.querySelector('.td-progress-text').textContent = bar.text;
        box.dataset.live = bar.live ? '1' : '0';
        if (bar.state !== box.dataset.state) {{
          box.dataset.state = bar.state;
          document.getElementById('{REFRESH_ID}')?.click();
        }}
      }}
    }} catch (e) {{ /* the panel restarting: the next poll tries again */ }}
    finally {{ busy = false; }}
  }}, {int(POLL_S * 1000)});
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
