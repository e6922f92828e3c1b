"""The Run tab: Start/Stop, state, progress, charts, rank-0 log, past runs and overlays.

Everything is read from run folders (the disk is the message bus): closing the page
never touches training, and a new page follows the live run. A 1-second timer calls
`tick`; it reads only appended bytes (RunWatch) and skips every output whose inputs
did not change, so an idle page costs a stat or two per second.
"""

from __future__ import annotations

import threading
import time
from html import escape

import gradio as gr

from tunedeck.app.charts import loss_figure, metrics_figure
from tunedeck.app.run_watch import RunWatches
from tunedeck.backend.run_folder import ACTIVE_STATES as ACTIVE
from tunedeck.backend.run_status import DAMAGED
from tunedeck.backend.run_summary import format_clock, measured_peaks, summarize
from tunedeck.backend.runs import RunError, RunManager, RunStatus

RUNS_LIST_TTL_S = 2.0
TABLE_HEADERS = ["run", "state", "job", "started", "duration"]
STATE_MARKS = {"queued": "⏳", "running": "▶", "stopping": "■", "finished": "✓", "failed": "✗", "stopped": "■", DAMAGED: "⚠"}


class RunsIndex:
    """list_runs(), shared by all sessions and refreshed at most every RUNS_LIST_TTL_S seconds."""

    def __init__(self, manager: RunManager):
        self.manager = manager
        self._runs: list[RunStatus] = []
        self._at = -1e9
        self._lock = threading.Lock()

    def runs(self, fresh: bool = False) -> list[RunStatus]:
        with self._lock:
            if fresh or time.monotonic() - self._at > RUNS_LIST_TTL_S:
                self._runs = self.manager.list_runs()
                self._at = time.monotonic()
            return self._runs


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""


def _duration(run: RunStatus) -> str:
    # Ended runs only: the table is redrawn when a run changes state, not every tick, so a live
    # run's clock would freeze here at its first value (its progress line shows the elapsed time).
    if not run.started_at or not run.ended_at:
        return ""
    return format_clock(run.ended_at - run.started_at)


def run_choices(runs: list[RunStatus]) -> list[tuple[str, str]]:
    return [(f"{STATE_MARKS.get(r.state, '')} {r.run_id} · {r.title}", r.run_id) for r in runs]


def progress_html(fraction: float, text: str, state: str) -> str:
    color = {"failed": "#dc2626", "finished": "#16a34a"}.get(state, "#4f46e5")
    return (
        f"<div class='td-progress'><div class='td-progress-track'><div class='td-progress-fill' "
        f"style='width:{100 * fraction:.1f}%;background:{color}'></div></div>"
        f"<div class='td-progress-text'>{escape(text)}</div></div>"
    )


class RunView:
    def __init__(self, manager: RunManager):
        self.manager = manager
        self.index = RunsIndex(manager)
        self.watches = RunWatches()
        self.memory_hook = None  # optional: (spec dict, measured peaks) -> markdown, set by the estimate view

    # ------------------------------------------------------------ layout

    def build(self) -> None:
        with gr.Row(equal_height=True):
            self.select = gr.Dropdown(label="Run", choices=[], value=None, elem_id="run-select", scale=4, filterable=False)
            self.stop = gr.Button("■ Stop", variant="stop", elem_id="stop-run", interactive=False, scale=1)
        self.state = gr.Markdown("No runs yet: pick a job and press **Start run**.", elem_id="run-state")
        self.progress = gr.HTML(elem_id="run-progress")
        self.facts = gr.Markdown(elem_id="run-facts")
        self.error = gr.Code(label="Error", language="shell", visible=False, elem_id="run-error", interactive=False)
        with gr.Row():
            self.smoothing = gr.Slider(0, 0.99, value=0.6, step=0.01, label="Smoothing (EMA weight)", elem_id="smoothing")
            self.log_scale = gr.Checkbox(label="Log scale", value=False, elem_id="log-scale")
            self.overlay = gr.Dropdown(label="Overlay the loss of", choices=[], value=None, elem_id="overlay-select", filterable=False)
        self.loss_plot = gr.Plot(show_label=False, elem_id="loss-chart")
        self.metrics_plot = gr.Plot(show_label=False, elem_id="metrics-chart")
        self.memory = gr.Markdown(elem_id="run-memory")
        self.log = gr.Textbox(
            label="rank-0 log", lines=14, max_lines=14, autoscroll=True, interactive=False, elem_id="run-log"
        )
        gr.Markdown("#### Past runs")
        self.table = gr.Dataframe(headers=TABLE_HEADERS, interactive=False, elem_id="runs-table", wrap=True)
        self.view = gr.State({"run": None, "follow": True})

    @property
    def outputs(self) -> list:
        return [
            self.view, self.select, self.overlay, self.table, self.state, self.progress, self.facts,
            self.error, self.loss_plot, self.metrics_plot, self.memory, self.log, self.stop,
        ]

    @property
    def chart_inputs(self) -> list:
        return [self.smoothing, self.log_scale, self.overlay]

    # ------------------------------------------------------------ rendering

    def render(self, view: dict, smoothing: float, log_scale: bool, overlay: str | None, force: bool = False) -> list:
        view = dict(view or {"run": None, "follow": True})
        runs = self.index.runs()
        if view.get("follow"):
            shown = [r for r in runs if r.state != DAMAGED] or runs
            view["run"] = next((r.run_id for r in shown if r.state in ACTIVE), shown[0].run_id if shown else None)
        out: list = [view]

        runs_sig = tuple((r.run_id, r.state) for r in runs)
        if force or view.get("runs_sig") != runs_sig or view.get("shown_run") != view["run"]:
            choices = run_choices(runs)
            out += [
                gr.update(choices=choices, value=view["run"]),
                gr.update(choices=[("(none)", "")] + choices, value=overlay or ""),
                [[r.run_id, r.state, r.title, _when(r.started_at), _duration(r)] for r in runs],
            ]
            view["runs_sig"] = runs_sig
        else:
            out += [gr.skip()] * 3

        run_id = view["run"]
        if run_id is None:
            view["shown_run"] = None
            return out + [gr.skip()] * 9
        try:
            status = self.manager.status(run_id)
        except RunError as exc:
            view["shown_run"] = None
            return out + [f"✗ {escape(str(exc))}"] + [gr.skip()] * 8
        watch = self.watches.get(self.manager.run_dir(run_id))
        version = watch.refresh()
        other = None
        if overlay and overlay != run_id:
            try:
                other = self.watches.get(self.manager.run_dir(overlay))
                other.refresh()
            except RunError:
                other = None
        sig = (run_id, version, status.state, status.error, overlay, other.version if other else None, smoothing, log_scale)
        summary = summarize(watch, status.started_at, status.ended_at)
        bar = progress_html(summary.fraction, summary.progress, status.state)
        if not force and view.get("sig") == sig:
            # Nothing new on disk: only the elapsed clock moves, and only while the run is live.
            return out + [gr.skip(), bar if status.state in ACTIVE else gr.skip()] + [gr.skip()] * 7
        view.update(sig=sig, shown_run=run_id)

        state_line = f"**{STATE_MARKS.get(status.state, '')} {status.state}** · run `{run_id}` · {escape(status.title)}"
        if status.state == "failed" and status.exit_code not in (None, 0):
            state_line += f" · exit code {status.exit_code}"
        runs_to_draw = [("this run", watch.records)] + ([(overlay, other.records)] if other else [])
        log_name, log_text = watch.log_text()
        return out + [
            state_line,
            bar,
            summary.facts,
            gr.update(value=status.error or "", visible=bool(status.error)),
            loss_figure(runs_to_draw, smoothing, log_scale),
            metrics_figure(watch.records),
            self._memory_markdown(run_id, watch),
            gr.update(value=log_text, label=f"{log_name} (last lines)"),
            gr.update(interactive=status.state in ("queued", "running")),
        ]

    def _memory_markdown(self, run_id: str, watch) -> str:
        peaks = measured_peaks(watch)
        if self.memory_hook is not None:
            try:
                return self.memory_hook(self.manager.job(run_id), peaks)
            except Exception as exc:  # the estimate is advice: never let it break the run view
                return f"(memory estimate unavailable: {escape(str(exc))})"
        if not peaks:
            return ""
        return "**Measured peak GPU memory per rank:** " + ", ".join(
            f"rank {i}: {gb:.2f} GB" for i, gb in enumerate(peaks.get("allocated", []))
        )

    # ------------------------------------------------------------ actions

    def start(self, spec, view: dict) -> tuple[str, dict]:
        """Launch `spec` (RunError says why not); the view then follows the new run."""
        run_id = self.manager.start(spec)
        self.index.runs(fresh=True)
        return run_id, {"run": run_id, "follow": False}

    def stop_run(self, view: dict) -> str:
        run_id = (view or {}).get("run")
        if not run_id:
            return "No run selected."
        status = self.manager.stop(run_id, grace_s=30)
        self.index.runs(fresh=True)
        return f"Stopping run `{run_id}`: ranks finish their step and save a checkpoint (state: {status.state})."

    def wire(self, notice: gr.Markdown, wrap) -> None:
        """Run picker, chart options and Stop; `wrap` turns handler errors into messages (the page's timer calls render)."""
        inputs = [self.view, *self.chart_inputs]

        def on_select(run_id, view, smoothing, log_scale, overlay):
            view = {"run": run_id or None, "follow": not run_id}
            return self.render(view, smoothing, log_scale, overlay, force=True)

        self.select.input(wrap(on_select), inputs=[self.select, *inputs], outputs=self.outputs, show_progress="hidden")
        for control in (self.smoothing, self.log_scale, self.overlay):
            control.input(
                wrap(lambda view, s, l, o: self.render(view, s, l, o or None, force=True)),
                inputs=inputs, outputs=self.outputs, show_progress="hidden", trigger_mode="always_last",
            )

        def on_stop(view, smoothing, log_scale, overlay):
            message = self.stop_run(view)
            return [message, *self.render(view, smoothing, log_scale, overlay, force=True)]

        self.stop.click(wrap(on_stop), inputs=inputs, outputs=[notice, *self.outputs], show_progress="hidden")
        # Gradio 6's Textbox autoscroll follows only the first update: keep the newest lines in view ourselves.
        self.log.change(None, js=FOLLOW_LOG_JS, show_progress="hidden")


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


CSS = """
.td-progress-track { height: 14px; border-radius: 7px; background: var(--background-fill-secondary); overflow: hidden; }
.td-progress-fill { height: 100%; transition: width 0.5s; }
.td-progress-text { font-size: 0.9em; margin-top: 4px; }
"""
