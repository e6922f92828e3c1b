"""The page: presets on top, then one tab per Section (Job · Run · GPUs), and Start, which joins two.

Layout and cross-tab wiring only; each section builds and wires its own tab (job_tab,
run_view, monitor_view), registered in one Registry under stable ids (registry.py).
To add a tab: write a Section (section.py) and add it to `sections` below; it can read any
other section's components by id (`page.ui["run.stop"]`) and join the page load and tick.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr
import gradio.themes

from tunedeck.app import after_tab, keyboard, monitor_view, run_state_line
from tunedeck.app.errors import user_message
from tunedeck.app.estimate_panel import measured_vs_predicted
from tunedeck.app.first_screen import Here, start_line
from tunedeck.app.form_marks import JUMP_JS
from tunedeck.app.idle_costs import narrow_progress_targets
from tunedeck.app.job_guard import NotShownYet, spec_as_shown
from tunedeck.app.job_tab import JobTab, ordered_presets
from tunedeck.app.job_view import JOB_QUEUE
from tunedeck.app.live_progress import POLL_JS, progress_route
from tunedeck.app.monitor_view import MonitorView
from tunedeck.app.registry import Got, Registry, Updates, handler, listen, unique
from tunedeck.app.run_actions import start_run, start_smoke, start_sweep
from tunedeck.app.run_view import RunView
from tunedeck.app.section import Page
from tunedeck.app.text_edits import FORWARD_EDITS_JS
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.machine import shared_monitor
from tunedeck.backend.runs import RunError, RunManager, SmokeError, SweepError, combinations, preview
from tunedeck.backend.spec import JobSpec, SpecError

CSS = (
    """
#presets button { min-width: 0; }
/* The page's one level-one heading (axe: page-has-heading-one), at the size of the section titles. */
#title h1 { font-size: 1.5rem; margin: 0; }
/* Problems where they are: Gradio 6 inputs have border-width 0, so a border colour shows nothing;
   an outline on the field's block does. */
.invalid { outline: 2px solid #dc2626 !important; outline-offset: -2px; }
.warned { outline: 2px solid #b45309 !important; outline-offset: -2px; }
.invalid .info-text { color: #b91c1c !important; }
.warned .info-text { color: #92400e !important; }
/* Help text at a readable size (its colour is the theme's, page_theme); the raw key a small hint. */
.info-text { font-size: 13px !important; }
.info-text code { font-size: 11px; color: inherit; background: var(--background-fill-secondary); padding: 0 3px; }
/* The file viewer in one dark ink: the stock highlighting colours read at 2-4:1 on its light background. */
#file-view .cm-content span { color: inherit !important; }
.dark #file-view .cm-content span { color: inherit !important; }
/* A calm form: fields in a grid of two columns, not one long column. */
/* Gradio wraps consecutive form components in one .form block: that block is the grid. */
.field-grid > .form {
  display: grid !important; grid-template-columns: repeat(2, minmax(0, 1fr)); background: var(--block-background-fill);
}
.field-grid > .form > .hidden { display: none !important; }
#form-sections [role=tablist] button { padding-left: 8px; padding-right: 8px; }
#job-fixes { gap: 6px; flex-wrap: wrap; }
#job-fixes button { flex: 0 1 auto; }
#job-issues { min-height: 2.5em; }
#file-tabs { gap: 4px; }
/* The button beside the strategy picker, level with its box, not stretched to the height of its label and help. */
#apply-strategy { align-self: flex-end; flex-grow: 0; min-width: 180px; margin-bottom: 11px !important; }
"""
    + monitor_view.CSS
    + run_state_line.CSS
    + after_tab.CSS
    + keyboard.CSS
)


class PanelBlocks(gr.Blocks):
    """The page's Blocks, carrying the Registry of its components and what launch() adds to Gradio's (app/serving.py)."""

    tunedeck_ui: Registry
    tunedeck_css: str
    tunedeck_js: str
    tunedeck_routes: list
    tunedeck_theme: gradio.themes.Base


def page_theme() -> gradio.themes.Base:
    """Gradio's Soft theme with its indigo one shade darker: the stock indigo-500 of labels, selected
    tabs and white-on-primary buttons reads at 3.6-4.5:1, below WCAG AA's 4.5:1 (tests/panel/test_browser_form.py
    measures every text of the page)."""
    indigo = gradio.themes.colors.indigo
    shades = (indigo.c50, indigo.c100, indigo.c200, indigo.c300, indigo.c500, indigo.c600, indigo.c700, indigo.c800)
    darker = gradio.themes.Color(*shades, indigo.c900, indigo.c950, indigo.c950, name="indigo-darker")
    # The subdued grey of help text and slider bounds is about 2.5:1 on white: gray-600 is 7.5:1.
    return gradio.themes.Soft(primary_hue=darker).set(
        body_text_color_subdued="*neutral_600",
        body_text_color_subdued_dark="*neutral_300",
        block_info_text_color="*neutral_600",
        block_info_text_color_dark="*neutral_300",
    )


def build_page(runs_dir: Path, preset_id: str | None = None, work_dir: Path | None = None) -> PanelBlocks:
    """The page; downloads are written under `work_dir` (default: a temp folder of their own).

    The Blocks carries `tunedeck_ui` (the Registry: every component by id), and the theme, CSS, JS and
    routes of its own that launch() adds (app/serving.py).
    """
    presets = ordered_presets()
    by_id = {p.id: p for p in presets}
    if preset_id is not None and preset_id not in by_id:
        raise ValueError(f"unknown preset {preset_id!r}; choose one of: {', '.join(by_id)}")
    job = JobTab(presets, by_id[preset_id].build() if preset_id else JobSpec(), shared_monitor(), work_dir, runs_dir)
    runs = RunView(RunManager(runs_dir))
    runs.memory_hook = measured_vs_predicted

    def live_slurm_runs() -> list:
        return [r for r in runs.index.runs() if r.slurm and r.state in ("queued", "running", "stopping")]

    sections = [
        job,
        runs,
        MonitorView(shared_monitor(), cluster_runs=live_slurm_runs, run_folder=runs.manager.run_dir),
        after_tab.AfterTab.for_runs(runs.manager, work_dir),
    ]

    page = Page(Registry())
    with PanelBlocks(title="tunedeck") as blocks:
        gr.Markdown("# tunedeck · distributed fine-tuning control panel", elem_id="title")
        preset = by_id[preset_id] if preset_id else None
        gr.Markdown(start_line(preset, Here.of(shared_monitor())), elem_id="start-here")
        page.build(sections)
        page.wire(blocks, sections)
        wire_start(page, job, runs)
        # The one component that Gradio's loading statuses of quiet events go to (app/idle_costs.py).
        narrow_progress_targets(blocks, gr.HTML(visible=False, elem_id="quiet-events"))
    blocks.tunedeck_ui = page.ui
    blocks.tunedeck_css = CSS  # launch() takes css and js in Gradio 6
    blocks.tunedeck_js = f"() => {{ ({FORWARD_EDITS_JS})(); ({JUMP_JS})(); ({POLL_JS})(); ({keyboard.JS})(); }}"
    blocks.tunedeck_routes = [progress_route(runs.manager, runs.watches)]  # launch() adds them to Gradio's app
    blocks.tunedeck_theme = page_theme()
    return blocks


STARTED = "Started"  # how a launch's notice begins when it launched

# After a launch, the Run tab is brought into view by a click on its tab, as a person would. Not by the
# main Tabs as an output of the launch: Gradio's page keeps every component an event ever updated in its
# loading-status list and, at every later event of the session, walks the whole subtree of each one in it
# and copies its components' values (charts, tables, the file view), which made each tick of a live run
# cost the browser several times more than before the first Start.
SHOW_RUN_JS = f"""(notice) => {{
  if ((notice || '').startsWith('{STARTED}')) document.querySelector('#tab-run-button')?.click();
}}"""


def wire_start(page: Page, job: JobTab, runs: RunView) -> None:
    """Start and Smoke test: the job the form holds, if the files beside it are that job's, runs (or its
    smoke run: the same path on a tiny model); the Run tab follows it."""
    view = job.view
    form, digest, job_shown = view.form.components, page.ui["job.digest"], view.shown

    def launcher(start, what: str):
        def on_click(got: Got) -> Updates:
            try:  # what the page shows runs (job_view's rule 3)
                run_id, shown = start(spec_as_shown([got[c] for c in form], got[digest], got[job_shown]))
            except (SpecError, RunError, SmokeError, NotShownYet) as exc:
                return {page.notice: f"✗ **Not started:** {user_message(exc, markdown=True)}"}
            return {page.notice: f"{STARTED} {what} `{run_id}`.", runs.shown: shown}

        return on_click

    launches = (
        ("job.start", functools.partial(start_run, runs.manager, runs.index), "run"),
        ("job.queue", functools.partial(start_run, runs.manager, runs.index, queue=True), "queued run"),
        ("job.smoke", functools.partial(start_smoke, runs.manager, runs.index), "smoke run"),
    )
    for button_id, start, what in launches:
        button = page.ui[button_id]
        listen(
            [button.click],
            launcher(start, what),
            inputs=[*form, digest, job_shown],
            outputs=[page.notice, runs.shown],
            concurrency_id="launch",  # one launch at a time, whoever clicks which
            concurrency_limit=1,
            show_progress="minimal",
            show_progress_on=[button],
        ).then(None, inputs=[page.notice], js=SHOW_RUN_JS).then(
            handler(view.recompute_if_refused),
            inputs={*view.inputs, page.notice},
            outputs=unique(view.outputs),
            show_progress="hidden",
            **JOB_QUEUE,
        )

    def on_sweep(got: Got) -> Updates:
        try:
            spec = spec_as_shown([got[c] for c in form], got[digest], got[job_shown])
            queued, shown = start_sweep(runs.manager, runs.index, spec, got[vary])
        except (SpecError, RunError, SweepError, NotShownYet) as exc:
            return {page.notice: f"✗ **Not started:** {user_message(exc, markdown=True)}"}
        listed = ", ".join(f"`{run_id}`" for run_id in queued)
        return {
            page.notice: f"{STARTED} a sweep of {len(queued)} runs, each after the one before: {listed}.",
            runs.shown: shown,
        }

    def on_vary(got: Got) -> Updates:  # the runs it would queue, as the values are typed
        lines = [line for line in (got[vary] or "").splitlines() if line.strip()]
        try:
            return {page.ui["job.sweep_preview"]: as_text(preview(combinations(lines))) if lines else ""}
        except SweepError as exc:
            return {page.ui["job.sweep_preview"]: f"✗ {as_text(exc)}"}

    vary, sweep = page.ui["job.vary"], page.ui["job.sweep"]
    listen(
        [vary.input],
        on_vary,
        inputs=[vary],
        outputs=[page.ui["job.sweep_preview"]],
        show_progress="hidden",
        trigger_mode="always_last",
    )
    listen(
        [sweep.click],
        on_sweep,
        inputs=[*form, digest, job_shown, vary],
        outputs=[page.notice, runs.shown],
        concurrency_id="launch",
        concurrency_limit=1,
        show_progress="minimal",
        show_progress_on=[sweep],
    ).then(None, inputs=[page.notice], js=SHOW_RUN_JS)
