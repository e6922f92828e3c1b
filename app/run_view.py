"""The Run tab: Stop, Resume and Stacks, state, progress, summary, name and notes, charts, rank-0 log, past runs.

Everything is read from run folders (the disk is the message bus): closing the page never touches training,
and a new page follows the live run. The page's tick calls `render`; it reads only appended bytes (RunWatch)
and returns only the outputs whose inputs changed (a RunShown per browser remembers what it shows), so an
idle page costs a stat or two per second.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import gradio as gr

from tunedeck.app.live_progress import FOLLOW_LOG_JS, REFRESH_ID
from tunedeck.app.oom_offer import BUTTON, next_updates
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.app.run_actions import resume_shown, stacks_notice, stop_run
from tunedeck.app.run_charts import RunCharts
from tunedeck.app.run_index import TABLE_HEADERS, RunsIndex, run_choices, table_row, unreadable_line
from tunedeck.app.run_shown import TICK_S, RunShown, charts_every_s
from tunedeck.app.run_state_line import memory_line, progress_html, results_line, state_line
from tunedeck.app.run_watch import RunWatches
from tunedeck.app.section import Page, Section
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.runs import ACTIVE_STATES as ACTIVE
from tunedeck.backend.runs import (
    DAMAGED,
    NAME_MAX_CHARS,
    Lineage,
    NotesError,
    RunError,
    RunManager,
    UnreadableJob,
    answers_markdown,
    health_lines,
    latest_answers,
    live_phase,
    measured_peaks,
    restart_cost,
    slow_rank_line,
    summarize,
    write_notes,
)

if TYPE_CHECKING:
    from tunedeck.backend.spec import JobSpec

# What a redraw may send, in the order of RunView.outputs (attributes the layout sets).
OUTPUTS = (
    "shown", "select", "table", "status", "progress", "facts", "summary", "name", "notes", "error", "next_line",
    "next_strategy", "answers", "memory", "log", "stop", "resume", "stacks",
)  # fmt: skip


class RunView(Section):
    id, title = "run", "Run"

    def __init__(self, manager: RunManager):
        self.manager = manager
        self.index = RunsIndex(manager)
        self.watches = RunWatches()
        self.charts = RunCharts(manager, Lineage(manager))
        # optional: (the run's job, measured peaks) -> markdown, set by the estimate view
        self.memory_hook: Callable[[JobSpec | UnreadableJob, dict], str] | None = None

    def build(self, page: Page) -> None:
        add = page.ui.add
        with gr.Row(equal_height=True):
            self.select = add(
                "run.select",
                gr.Dropdown(label="Run", choices=[], value=None, elem_id="run-select", scale=4, filterable=False),
            )
            self.stop = add(
                "run.stop", gr.Button("■ Stop", variant="stop", elem_id="stop-run", interactive=False, scale=1)
            )
            self.resume = add(  # a stopped or failed run, from the newest checkpoint in its own folder
                "run.resume", gr.Button("↻ Resume", elem_id="resume-run", interactive=False, scale=1)
            )
            # Empty: as it ran; else on this many processes, with the same global batch (backend/runs/reshape.py).
            resume_on = gr.Number(label="Resume on processes", placeholder="as it ran", precision=0, scale=1)
            resume_on.elem_id = "resume-processes"
            self.resume_processes = add("run.resume_processes", resume_on)
            self.stacks = add(  # a live run's ranks on this machine: where each one is, what it waits for
                "run.stacks", gr.Button("Stacks", elem_id="stacks-run", interactive=False, scale=1)
            )
        self.status = add(
            "run.status", gr.Markdown("No runs yet: pick a job and press **Start run**.", elem_id="run-state")
        )
        self.progress = add("run.progress", gr.HTML(elem_id="run-progress"))
        self.facts = add("run.facts", gr.Markdown(elem_id="run-facts"))
        self.summary = add("run.summary", gr.Markdown(elem_id="run-summary"))
        with gr.Row():
            self.name = add(
                "run.name",
                gr.Textbox(
                    label="Name",
                    placeholder="name this run (Enter or leaving the box saves it)",
                    max_length=NAME_MAX_CHARS,
                    elem_id="run-name",
                    scale=1,
                ),
            )
            self.notes = add(
                "run.notes",
                gr.Textbox(
                    label="Notes",
                    placeholder="what you tried, what you saw (saved when you leave the box)",
                    lines=1,
                    max_lines=6,
                    elem_id="run-notes",
                    scale=3,
                ),
            )
        self.error = add(
            "run.error", gr.Code(label="Error", language="shell", visible=False, elem_id="run-error", interactive=False)
        )
        with gr.Row(equal_height=True):  # a run that ran out of memory: the advisor's next strategy, one click away
            self.next_line = add("run.next_line", gr.Markdown(elem_id="run-next-line"))
            self.next_strategy = add(
                "run.next_strategy",
                gr.Button(BUTTON, visible=False, elem_id="run-next-strategy", scale=0, min_width=300),
            )
        self.charts.build(add)  # the chart options, the loss and metrics charts, by source and by rank
        self.answers = add("run.answers", gr.Markdown(elem_id="run-answers"))  # GRPO's: what the model writes
        self.memory = add("run.memory", gr.Markdown(elem_id="run-memory"))
        self.log = add(
            "run.log",
            gr.Textbox(
                label="rank-0 log", lines=14, max_lines=14, autoscroll=True, interactive=False, elem_id="run-log"
            ),
        )
        gr.Markdown("#### Past runs")
        self.table = add(
            "run.table", gr.Dataframe(headers=TABLE_HEADERS, interactive=False, elem_id="runs-table", wrap=True)
        )
        self.shown = add("run.shown", gr.State(RunShown()))
        # Pressed by the page, not by people, when a live run's stream says its state changed (app/live_progress.py).
        self.refresh = add("run.refresh", gr.Button("Refresh", visible="hidden", elem_id=REFRESH_ID))

    @property
    def outputs(self) -> list:
        return [getattr(self, name) for name in OUTPUTS] + self.charts.outputs

    @property
    def details(self) -> list:
        """The outputs a tick of a live run sends again when anything about the run changed: only the changed ones
        go (RunShown.unchanged)."""
        return [
            *(self.status, self.facts, self.summary, self.error, self.next_line, self.next_strategy),
            *(self.stop, self.resume, self.stacks, self.memory),
        ]

    @property
    def inputs(self) -> list:
        """What a redraw reads: what the browser shows, and the chart options."""
        return [self.shown, *self.charts.options]

    def redraw(self, got: Got, force: bool = False, shown: RunShown | None = None) -> Updates:
        """render() with a listener's inputs; `shown` stands in for the browser's RunShown."""
        shown = shown or got[self.shown]
        smoothing, log_scale, overlay = (got[c] for c in self.charts.options)
        return self.render(shown, smoothing, log_scale, overlay or None, force=force)

    def render(
        self, old: RunShown, smoothing: float, log_scale: bool, overlay: str | None, force: bool = False
    ) -> Updates:
        """The outputs that differ from what `old` drew (all of them with `force`)."""
        shown, out = replace(old, texts={} if force else dict(old.texts)), {}
        self._draw(shown, out, smoothing, log_scale, overlay, force)
        shown.unchanged(out, self.details)
        if shown != old:
            out[self.shown] = shown
        return out

    def _draw(
        self, shown: RunShown, out: Updates, smoothing: float, log_scale: bool, overlay: str | None, force: bool
    ) -> None:
        runs = self.index.runs()
        if shown.follow:
            listed = [r for r in runs if r.state != DAMAGED] or runs
            shown.run = next((r.run_id for r in listed if r.state in ACTIVE), listed[0].run_id if listed else None)

        run_id, status = shown.run, None
        try:
            status = self.manager.status(run_id) if run_id is not None else None
        except RunError as exc:
            out[self.status] = f"✗ {as_text(exc)}"
        if status and any(r.run_id == run_id and r.state != status.state for r in runs):
            runs = self.index.runs(fresh=True)  # the shared list lags the run folder: the Run box follows it
        runs_sig = tuple((r.run_id, r.state) for r in runs)
        if force or shown.runs_sig != runs_sig or shown.shown_run != shown.run:
            choices = run_choices(self.index, runs)
            out[self.select] = gr.update(choices=choices, value=shown.run)
            out[self.charts.overlay] = gr.update(choices=[("(none)", "")] + choices, value=overlay or "")
            out[self.table] = [table_row(r, self.index.facts(r)) for r in runs]
            shown.runs_sig = runs_sig
        if status is None or run_id is None:  # (no status without a run)
            shown.shown_run = None
            return
        watch, other = self._records(run_id), None
        if overlay and overlay != run_id:
            with contextlib.suppress(RunError):  # an overlaid run deleted meanwhile: none
                other = self._records(overlay)
        facts = self.index.facts(status)
        # What the state line, progress and summary say (the Slurm `where`: queue state and reason, then nodes).
        sig = (run_id, watch.records_version, status.state, status.error, facts.notes, facts.checkpoint, status.where)
        sig += watch.warnings
        summary = summarize(
            watch,
            status.started_at,
            status.ended_at,
            job=facts.job,
            phase=live_phase(watch.run_dir, watch, status.ended_at),
        )
        new_run = force or shown.shown_run != run_id
        details_due = new_run or shown.sig != sig
        # Charts and log only when their own data grew (a progress bar rewrites the log far more often than a step
        # logs); the charts of a live run at most every charts_every_s.
        plots = (
            (run_id, overlay, smoothing, log_scale, watch.evals),
            (watch.records_version, other and other.records_version),
        )
        every_s = charts_every_s(summary.elapsed_s or 0.0)
        late = status.state not in ACTIVE or time.monotonic() - shown.charts_at >= every_s
        drawn = shown.charts_sig or (None, None)
        charts_due = new_run or drawn[0] != plots[0] or (drawn[1] != plots[1] and late)
        log_due = new_run or shown.log_sig != (run_id, watch.log_version)
        if details_due:
            shown.sig = sig
            if shown.notes_run != run_id:  # the boxes are the user's while they type: filled once per run shown
                shown.notes_run = run_id
                out[self.name], out[self.notes] = facts.notes.name, facts.notes.notes
            results = results_line(watch, status)
            said = [*health_lines(watch), *status.attempt_lines(), restart_cost(watch, status.attempts) or ""]
            said += [*watch.warnings, slow_rank_line(watch.records) or ""]
            live = status.state in ("running", "stopping") and status.backend == "local"
            out[self.status] = state_line(status, facts, summary.step, run_id, self.manager.run_dir(run_id), said)
            network = summary.network and f"network: {summary.network}"
            out[self.facts] = as_text(" · ".join(filter(None, (summary.facts, network, unreadable_line(facts)))))
            out[self.summary] = f"**{'Summary' if status.state not in ACTIVE else 'So far'}:** {results}" * bool(
                results
            )
            out[self.error] = gr.update(value=status.error or "", visible=bool(status.error))
            out[self.next_line], out[self.next_strategy] = next_updates(status, facts.job)
            out[self.stop] = gr.update(interactive=status.state in ("queued", "running"))
            out[self.resume] = gr.update(interactive=facts.checkpoint is not None)
            out[self.stacks] = gr.update(interactive=live)  # Stacks: a live run's ranks on this machine
        bar_sig = (run_id, status.state, None if status.state in ACTIVE else watch.records_version)
        if new_run or shown.bar_sig != bar_sig:  # a live run's bar moves with its stream (app/live_progress.py)
            shown.bar_sig = bar_sig
            out[self.progress] = progress_html(summary.fraction, summary.progress, status.state, run_id)
        if charts_due:
            shown.charts_sig, shown.charts_at = plots, time.monotonic()
            compare = new_run or drawn[0] != plots[0]  # another run or overlay: what the overlaid run did differently
            options = dict(smoothing=smoothing, log_scale=log_scale, compare=compare)
            self.charts.draw(out, run_id, watch, other, overlay, facts.job, self._records, **options)
            out[self.answers] = answers_markdown(latest_answers(self.manager.run_dir(run_id)), as_text)
            out[self.memory] = self._memory_markdown(run_id, watch)
        if log_due:
            shown.log_sig = (run_id, watch.log_version)
            log_name, log_text = watch.log_text()
            out[self.log] = gr.update(value=log_text, label=f"{log_name} (last lines)")
        shown.shown_run = run_id

    def _records(self, run_id: str):  # the run's RunWatch, with what its files gained since the last look
        (watch := self.watches.get(self.manager.run_dir(run_id))).refresh()
        return watch

    def _memory_markdown(self, run_id: str, watch) -> str:
        peaks = measured_peaks(watch)
        if self.memory_hook is not None:
            try:
                return self.memory_hook(self.manager.job(run_id), peaks)
            except Exception as exc:  # noqa: BLE001 - the estimate is advice: never let it break the run view
                return f"(memory estimate unavailable: {as_text(exc)})"
        return memory_line(peaks)

    def wire(self, page: Page) -> None:
        """Run picker, chart options, Stop, Resume, name and notes; the page's tick and load redraw what changed."""

        def on_select(got: Got) -> Updates:
            return self.redraw(got, force=True, shown=got[self.shown].picked(got[self.select]))

        def on_option(got: Got) -> Updates:
            return self.redraw(got, force=True)

        def on_stop(got: Got) -> Updates:
            return {page.notice: stop_run(self.manager, self.index, got[self.shown]), **self.redraw(got, force=True)}

        def on_stacks(got: Got) -> Updates:
            return {page.notice: stacks_notice(self.manager, got[self.shown]), **self.redraw(got, force=True)}

        def on_resume(got: Got) -> Updates:
            try:
                notice, shown = resume_shown(self.manager, self.index, got[self.shown], got[self.resume_processes])
            except RunError as exc:
                return {page.notice: f"✗ **Not resumed:** {as_text(exc)}"}
            return {page.notice: notice, **self.redraw(got, force=True, shown=shown)}

        def on_notes(got: Got) -> Updates:
            run_id = got[self.shown].notes_run
            if run_id is None:
                return {}
            try:
                write_notes(self.manager.run_dir(run_id), got[self.name] or "", got[self.notes] or "")
            except (NotesError, RunError) as exc:
                return {page.notice: f"✗ **Not saved:** {as_text(exc)}"}
            return self.redraw(got, force=True)  # the table and the state line show the new name

        listen(
            [self.resume.click],
            on_resume,
            inputs=[*self.inputs, self.resume_processes],
            outputs=[page.notice, *self.outputs],
            concurrency_id="launch",  # one launch at a time, with Start and Smoke test (page.py)
            concurrency_limit=1,
            show_progress="minimal",
            show_progress_on=[self.resume],
        )
        listen(
            [self.name.blur, self.name.submit, self.notes.blur],
            on_notes,
            inputs=[self.name, self.notes, *self.inputs],
            outputs=[page.notice, *self.outputs],
            show_progress="hidden",
            # Gradio's default ("once") drops a trigger while the last is pending: leaving the name box for the
            # notes box and the notes box soon after lost the notes. The last edit is always saved.
            trigger_mode="always_last",
        )
        listen(
            [self.select.input],
            on_select,
            inputs=[self.select, *self.inputs],
            outputs=self.outputs,
            show_progress="hidden",
        )
        listen(
            [self.refresh.click],
            lambda got: self.redraw(got),
            inputs=self.inputs,
            outputs=self.outputs,
            show_progress="hidden",
            trigger_mode="always_last",
        )
        options = [option.input for option in self.charts.options]
        listen(
            options,
            on_option,
            inputs=self.inputs,
            outputs=self.outputs,
            show_progress="hidden",
            trigger_mode="always_last",
        )
        for button, handler in ((self.stop, on_stop), (self.stacks, on_stacks)):
            listen(
                [button.click],
                handler,
                inputs=self.inputs,
                outputs=[page.notice, *self.outputs],
                show_progress="hidden",
            )
        # Drawn while its tab is in view; selecting the tab draws it at once (section.Page.wire).
        page.on_tick(
            self.id,
            lambda got, in_view: self.redraw(got) if in_view == self.id else {},
            inputs=self.inputs,
            outputs=self.outputs,
            every_s=TICK_S,
        )
        page.on_load(lambda got: self.redraw(got, force=True), inputs=self.inputs, outputs=self.outputs)
        # Gradio 6's Textbox autoscroll follows only the first update: keep the newest lines in view ourselves.
        self.log.change(None, js=FOLLOW_LOG_JS, show_progress="hidden")
        page.ui["page.tab.run"].select(None, js=FOLLOW_LOG_JS)  # a log filled while the tab was hidden opens at its end
