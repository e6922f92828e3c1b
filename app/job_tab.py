"""The Job tab: preset buttons and the uploads (a job.yaml, data) above the tabs, the form, and beside it what
the job produces (job_view) and what it costs in memory (estimate_panel).

Presets, the uploads and Apply are fills: each replaces the whole form with a spec and
tells the notice line what it did. Their order with edits and the page load is job_view's
(its docstring has the three rules).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from tunedeck.app.advanced_counts import AdvancedCounts
from tunedeck.app.data_upload import fill_from_upload
from tunedeck.app.dataset_preview import DatasetPreview
from tunedeck.app.downloads import BundleWriter
from tunedeck.app.estimate_panel import EstimatePanel
from tunedeck.app.form import build_form
from tunedeck.app.job_events import JobEvent
from tunedeck.app.job_outputs import ThisMachine, read_uploaded_spec
from tunedeck.app.job_view import JOB_QUEUE, JobView
from tunedeck.app.model_access import ModelAccessNote
from tunedeck.app.oom_offer import job_with_offer
from tunedeck.app.run_shown import RunShown
from tunedeck.app.section import Page, Section
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.data import SUFFIXES as DATA_SUFFIXES
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import (
    FORM_FIELDS,
    JobSpec,
    Preset,
    describe,
    load_presets,
    set_paths,
    spec_from_values,
    spelled,
    values_from_form,
    values_from_spec,
)
from tunedeck.backend.spec import apply_implied as implied

# Presets in the order a newcomer reads them: the runnable demo, then growing model sizes.
PRESET_ORDER = ("demo", "7b-lora-ddp", "7b-full-zero2", "13b-lora-fsdp", "70b-qlora-zero3", "70b-qlora-fsdp")


def ordered_presets() -> list[Preset]:
    presets = load_presets()
    first = [presets[i] for i in PRESET_ORDER if i in presets]
    return first + [p for i, p in sorted(presets.items()) if i not in PRESET_ORDER]


class JobTab(Section):
    id, title = "job", "Job"

    def __init__(
        self, presets: list[Preset], initial: JobSpec, monitor, work_dir: Path | None, runs_dir: Path | None = None
    ):
        self.presets = presets
        self.initial = initial
        self.monitor = monitor
        self.runs_dir = runs_dir
        self.writer = BundleWriter(work_dir and work_dir / "bundles")

    def build_top(self, page: Page) -> None:
        add = page.ui.add
        with gr.Row(elem_id="presets", equal_height=True):
            for p in self.presets:
                add("job.preset." + p.id, gr.Button(p.title, size="sm", elem_id="preset-" + p.id, min_width=100))
            self.upload = add(
                "job.upload",
                gr.UploadButton(
                    "⬆ Upload job.yaml", file_types=[".yaml", ".yml"], size="sm", elem_id="upload-job", min_width=100
                ),
            )
            self.upload_data = add(
                "job.upload_data",
                gr.UploadButton(
                    "⬆ Upload data",
                    file_types=list(DATA_SUFFIXES),
                    file_count="multiple",
                    size="sm",
                    elem_id="upload-data",
                    min_width=100,
                ),
            )

    def build(self, page: Page) -> None:
        initial = values_from_spec(self.initial)
        with gr.Row():
            with gr.Column(scale=6):
                form = build_form({f.path: f.to_form(initial[f.path]) for f in FORM_FIELDS}, page.ui)
                self.access = ModelAccessNote(page.ui, self.initial.model.name_or_path)
                self.preview = DatasetPreview(page.ui)
                self.preview.build()
            with gr.Column(scale=5):
                self.view = JobView(page.ui, form, list(render_bundle(self.initial)), self.writer)
                self.view.here = ThisMachine(self.runs_dir, self.monitor) if self.runs_dir else None
                self.estimate = EstimatePanel(page.ui, self.monitor, self.runs_dir)
                self.view.build_status()
                self.estimate.build_advice()
                self.view.build_files()
        self.estimate.build_details()
        self.view.derived += [self.estimate, self.preview, self.access, AdvancedCounts(page.ui, form)]

    def wire(self, page: Page) -> None:
        view, notice = self.view, page.notice
        view.notice = notice  # an edit that sets implied fields says so there
        view.wire()
        for button in view.fix_buttons:

            def fix(event: JobEvent, button=button):
                return view.fix(event, event.got[button])

            view.wire_fill(button.click, fix, notice, reads=(button,))
        for preset in self.presets:

            def load_preset(event: JobEvent, preset: Preset = preset):
                meant = self.estimate.follow_preset(preset, event.got)
                return preset.build(), f"Loaded preset **{preset.title}**: {preset.description} {meant}"

            view.wire_fill(page.ui["job.preset." + preset.id].click, load_preset, notice)

        def upload(event: JobEvent):
            message, spec = read_uploaded_spec(event.got[self.upload])
            return spec, message

        view.wire_fill(self.upload.upload, upload, notice, reads=(self.upload,))

        def upload_data(event: JobEvent):
            return fill_from_upload(values_from_form(event.raw), event.got[self.upload_data], self.runs_dir)

        uploaded = view.wire_fill(self.upload_data.upload, upload_data, notice, reads=(self.upload_data,))
        view.wire_fill(self.estimate.apply.click, self.apply, notice)
        view.wire_fill(self.estimate.apply_pick.click, self.apply_picked, notice, reads=(self.estimate.pick,))
        self.preview.wire(view, uploaded, notice)
        if "run.next_strategy" in page.ui:  # the Run tab's offer after a run ran out of memory
            shown = page.ui["run.shown"]
            view.wire_fill(
                page.ui["run.next_strategy"].click, lambda event: self.next_strategy(event.got[shown]), notice, (shown,)
            )
            page.ui["run.next_strategy"].click(None, js="() => document.getElementById('tab-job-button')?.click()")
        page.on_load(view.on_load, inputs=view.inputs, outputs=view.outputs, **JOB_QUEUE)

    def next_strategy(self, shown: RunShown):
        """The Run tab's "Load the job with ...": the run's own job with the advisor's next strategy after it ran out
        of memory (app/oom_offer.py)."""
        job, said, changes = job_with_offer(self.runs_dir, shown)
        if job is None:
            return None, said
        spec, notice = applied(job, said, changes)
        return spec, f"Loaded the job of run `{shown.run}`. {notice} Check the estimate, then press **Start run**."

    def apply(self, event: JobEvent):
        """Apply: the recommendation's changes for the job the form holds."""
        if event.stale:  # the advice the user saw was for a job the page has since replaced
            return None, "The job changed before Apply arrived; read the new advice and press Apply again."
        spec = spec_from_values(values_from_form(event.raw))
        strategy, changes = self.estimate.apply_recommendation(spec, event.got)
        if not changes:
            return None, "The job already follows the recommendation."
        return applied(spec, strategy, changes)

    def apply_picked(self, event: JobEvent):
        """Apply this strategy: the picked row's changes for the job the form holds."""
        if event.stale:
            return None, "The job changed before Apply arrived; pick the strategy again."
        values = values_from_form(event.raw)
        spec = spec_from_values(values)
        try:
            strategy, changes = self.estimate.apply_option(spec, values, event.got)
        except ValueError as exc:
            return None, f"Nothing applied: {as_text(exc)}."
        if not changes:
            return None, f"The job already uses **{strategy}**."
        return applied(spec, strategy, changes)


def applied(spec: JobSpec, strategy: str | None, changes: dict) -> tuple[JobSpec, str]:
    """The job with `changes` and what they imply (the rules an edit in the form follows), and the notice that
    lists both: applying FSDP to a QLoRA job leaves no warning for Apply to cause."""
    _, also = implied({**values_from_spec(spec), **changes}, set(changes))
    listed = ", ".join(f"`{path}` → `{spelled(value)}`" for path, value in changes.items())  # as YAML: false
    notice = f"Applied **{strategy}**: {listed}." + (f" {describe(also)}" if also else "")
    return set_paths(spec, {**changes, **{path: v for found in also for path, v in found.changes.items()}}), notice
