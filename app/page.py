"""The page: presets on top, then one tab per Section (Job · Run · GPUs), and Start, which joins two.

Layout and cross-tab wiring only; each section builds and wires its own tab (job_tab,
run_view, monitor_view), registered in one Registry under stable ids (registry.py).
To add a tab: write a Section (section.py) and add it to `sections` below; it can read any
other section's components by id (`page.ui["run.stop"]`) and join the page load and tick.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import gradio as gr

from tunedeck.app import monitor_view, run_view
from tunedeck.app.errors import user_message
from tunedeck.app.estimate_panel import measured_vs_predicted
from tunedeck.app.job_tab import JobTab, ordered_presets
from tunedeck.app.job_view import NotShownYet
from tunedeck.app.monitor_view import MonitorView
from tunedeck.app.registry import Got, Registry, Updates, listen
from tunedeck.app.run_view import RunView
from tunedeck.app.section import Page
from tunedeck.backend.monitor import shared_monitor
from tunedeck.backend.runs import RunError, RunManager
from tunedeck.backend.spec import JobSpec, SpecError

CSS = (
    """
#presets button { min-width: 0; }
.invalid input, .invalid textarea, .invalid .wrap { border-color: var(--error-border-color, #ef4444) !important; }
#job-issues { min-height: 2.5em; }
#file-tabs { gap: 4px; }
"""
    + monitor_view.CSS
    + run_view.CSS
)


def build_page(runs_dir: Path, preset_id: str | None = None, work_dir: Path | None = None) -> gr.Blocks:
    """The page; downloads are written under `work_dir` (default: a temp folder of their own).

    The Blocks carries `tunedeck_ui` (the Registry: every component by id) and `tunedeck_css`.
    """
    presets = ordered_presets()
    by_id = {p.id: p for p in presets}
    if preset_id is not None and preset_id not in by_id:
        raise ValueError(f"unknown preset {preset_id!r}; choose one of: {', '.join(by_id)}")
    job = JobTab(presets, by_id[preset_id].build() if preset_id else JobSpec(), shared_monitor(), work_dir)
    runs = RunView(RunManager(runs_dir))
    runs.memory_hook = measured_vs_predicted

    def live_slurm_runs() -> list:
        return [r for r in runs.index.runs() if r.slurm and r.state in ("queued", "running", "stopping")]

    sections = [job, runs, MonitorView(shared_monitor(), cluster_runs=live_slurm_runs)]

    page = Page(Registry())
    with gr.Blocks(title="tunedeck") as blocks:
        gr.Markdown("## tunedeck · distributed fine-tuning control panel", elem_id="title")
        page.build(sections)
        page.wire(blocks, sections)
        wire_start(page, job, runs)
    blocks.tunedeck_ui = page.ui
    blocks.tunedeck_css = CSS  # launch() takes css in Gradio 6
    return blocks


def wire_start(page: Page, job: JobTab, runs: RunView) -> None:
    """Start: the job the form holds, if the files beside it are that job's, runs; the Run tab follows it."""
    form, digest = job.view.form.components, page.ui["job.digest"]

    def on_start(got: Got) -> Updates:
        try:  # what the page shows runs (job_view's rule 3)
            run_id, shown = runs.start(job.view.spec_as_shown([got[c] for c in form], got[digest]))
        except (SpecError, RunError, NotShownYet) as exc:
            return {page.notice: f"✗ **Not started:** {escape(user_message(exc))}"}
        return {page.notice: f"Started run `{run_id}`.", runs.shown: shown, **page.select(runs.id)}

    start = page.ui["job.start"]
    listen(
        [start.click],
        on_start,
        inputs=[*form, digest],
        outputs=[page.notice, runs.shown, page.tabs, page.in_view],
        concurrency_limit=1,  # one launch at a time, whoever clicks
        show_progress="minimal",
        show_progress_on=[start],
    )
