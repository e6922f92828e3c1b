"""The job view's ordering rules, on its handlers directly (the browser tests drive the real orderings)."""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.downloads import BundleWriter, bundle_digest
from tunedeck.app.form import build_form
from tunedeck.app.job_events import JobEvent, JobShown
from tunedeck.app.job_guard import NotShownYet, spec_as_shown
from tunedeck.app.job_view import JobView
from tunedeck.app.registry import Registry
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import JobSpec, load_presets, set_paths
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_spec


@pytest.fixture
def job(tmp_path):
    spec = JobSpec()
    with gr.Blocks():
        ui = Registry()
        form = build_form({f.path: f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())}, ui)
        view = JobView(ui, form, list(render_bundle(spec)), BundleWriter(tmp_path))
        view.build_status()
        view.build_files()
    return view


def form_of(spec) -> list:
    return [f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())]


def got(job: JobView, spec, shown: JobShown, fills: int) -> dict:
    """What a job listener receives from a browser whose form holds `spec`."""
    return {**dict(zip(job.form.components, form_of(spec))), job.shown: shown, job.fills: fills}


def event(job: JobView, spec, shown: JobShown, fills: int) -> JobEvent:
    return job.event(got(job, spec, shown, fills))


def test_a_page_load_answered_after_a_preset_changes_nothing(job):
    demo = load_presets()["demo"].build()
    filled = job.on_fill(demo, event(job, JobSpec(), JobShown(), 0))
    shown = filled[job.shown]
    assert filled[job.fills] == 1 and filled[job.digest] == bundle_digest(render_bundle(demo))
    # The load fired with the page's first values; it is answered after the preset.
    assert job.on_load(got(job, JobSpec(), shown, 0)) == {}
    # Before anything painted, the load paints.
    first = job.on_load(got(job, JobSpec(), JobShown(), 0))
    assert first[job.digest] == bundle_digest(render_bundle(JobSpec()))


def test_an_edit_fired_before_a_preset_arrived_is_dropped_and_later_edits_apply(job):
    demo = load_presets()["demo"].build()
    shown = job.on_fill(demo, event(job, JobSpec(), JobShown(), 0))[job.shown]
    stale = set_paths(JobSpec(), {"training.gradient_accumulation_steps": 12})
    assert job.on_edit(got(job, stale, shown, 0)) == {}

    edited = set_paths(demo, {"training.gradient_accumulation_steps": 12})
    out = job.on_edit(got(job, edited, shown, 1))  # the browser has applied the fill
    assert out[job.digest] == bundle_digest(render_bundle(edited))
    assert job.fills not in out  # an edit is not a fill


def test_an_edit_sends_only_the_outputs_it_changed(job):
    demo = load_presets()["demo"].build()
    first = job.on_edit(got(job, demo, JobShown(), 0))  # the first paint sends everything
    assert {job.issues, job.batch, job.start, job.file_choice, job.code, job.digest, job.downloads.zip} <= set(first)
    edited = set_paths(demo, {"training.gradient_accumulation_steps": 12})
    out = job.ui.by_id(job.on_edit(got(job, edited, first[job.shown], 0)))
    # The global batch and the bundle changed; no field's look, no problem, not Start, not the file strip, not the
    # zip button (its click makes the zip: app/job_downloads.py).
    assert set(out) == {"job.batch", "job.digest", "job.file_downloads", "job.shown"} | (
        {"job.file_view"} & set(out)  # the file in view changed only if it holds the accumulation steps
    ), sorted(out)
    assert "× 12 accumulation steps" in out["job.batch"]
    again = job.on_edit(got(job, edited, out["job.shown"], 0))
    assert again == {}  # the same form again: nothing to send


def test_a_filled_job_shows_the_files_of_what_its_widgets_hold(job):
    """A float box holds 6 digits: an uploaded 1.2345678e-4 is shown, and run, as 0.000123457."""
    from tunedeck.backend.spec.fields import spec_from_values, values_from_form

    uploaded = set_paths(JobSpec(), {"training.learning_rate": 1.2345678e-4})
    out = job.on_fill(uploaded, event(job, JobSpec(), JobShown(), 0))
    widgets = [out[c]["value"] for c in job.form.components]
    what_start_runs = spec_from_values(values_from_form(widgets))  # page.on_start reads the widgets
    assert out[job.digest] == bundle_digest(render_bundle(what_start_runs))


def test_start_gets_the_forms_job_only_while_the_files_shown_are_that_jobs(job):
    demo = load_presets()["demo"].build()
    shown = bundle_digest(render_bundle(demo))
    assert spec_as_shown(form_of(demo), shown) == demo
    edited = set_paths(demo, {"training.max_steps": 3})  # typed, its files still on their way
    with pytest.raises(NotShownYet, match="press Start again"):
        spec_as_shown(form_of(edited), shown)


def test_apply_also_sets_what_its_changes_imply():
    """Apply follows the form's own rules: FSDP for a QLoRA job leaves RAM-efficient loading off, and says so."""
    from tunedeck.app.job_tab import applied
    from tunedeck.backend.validate import validate

    spec = load_presets()["70b-qlora-zero3"].build()
    assert spec.strategy.fsdp_cpu_ram_efficient_loading
    fsdp, notice = applied(spec, "FSDP FULL_SHARD", {"strategy.kind": "fsdp"})
    assert fsdp.strategy.kind == "fsdp" and not fsdp.strategy.fsdp_cpu_ram_efficient_loading
    assert notice.startswith("Applied **FSDP FULL_SHARD**: `strategy.kind` → `fsdp`. Set for you: ")
    assert "`strategy.fsdp_cpu_ram_efficient_loading` → `false`" in notice
    assert not [p for p in validate(fsdp) if p.field == "strategy.fsdp_cpu_ram_efficient_loading"]
    same, plain = applied(spec, "ZeRO-3 + CPU optimizer", {"strategy.offload_optimizer": "cpu"})
    assert "Set for you" not in plain and same.strategy.offload_optimizer == "cpu"
