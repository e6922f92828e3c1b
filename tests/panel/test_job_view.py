"""The job view's ordering rules, on its handlers directly (the browser tests drive the real orderings)."""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.downloads import BundleWriter, bundle_digest
from tunedeck.app.form import build_form
from tunedeck.app.job_view import JobEvent, JobView, NotShownYet
from tunedeck.backend.fields import FORM_FIELDS, values_from_spec
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import JobSpec, load_presets, set_paths


@pytest.fixture
def job(tmp_path):
    spec = JobSpec()
    with gr.Blocks():
        form = build_form({f.path: f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())})
        view = JobView(form, list(render_bundle(spec)), BundleWriter(tmp_path))
        view.build_status()
        view.build_files()
    return view


def form_of(spec) -> list:
    return [f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())]


def output(job: JobView, out: list, component):
    return out[job.outputs.index(component)]


def skipped(out: list) -> bool:
    return all(value == gr.skip() for value in out)


def test_a_page_load_answered_after_a_preset_changes_nothing(job):
    demo = load_presets()["demo"].build()
    filled = job.on_fill(demo, JobEvent(form_of(JobSpec()), {}, 0, []))
    shown = output(job, filled, job.shown)
    assert output(job, filled, job.fills) == 1 and output(job, filled, job.digest) == bundle_digest(render_bundle(demo))
    # The load fired with the page's first values; it is answered after the preset.
    assert skipped(job.on_load(JobEvent(form_of(JobSpec()), shown, 0, [])))
    # Before anything painted, the load paints.
    first = job.on_load(JobEvent(form_of(JobSpec()), {}, 0, []))
    assert output(job, first, job.digest) == bundle_digest(render_bundle(JobSpec()))


def test_an_edit_fired_before_a_preset_arrived_is_dropped_and_later_edits_apply(job):
    demo = load_presets()["demo"].build()
    shown = output(job, job.on_fill(demo, JobEvent(form_of(JobSpec()), {}, 0, [])), job.shown)
    stale = set_paths(JobSpec(), {"training.gradient_accumulation_steps": 12})
    assert skipped(job.on_edit(JobEvent(form_of(stale), shown, 0, [])))

    edited = set_paths(demo, {"training.gradient_accumulation_steps": 12})
    out = job.on_edit(JobEvent(form_of(edited), shown, 1, []))  # the browser has applied the fill
    assert output(job, out, job.digest) == bundle_digest(render_bundle(edited))
    assert output(job, out, job.fills) == gr.skip()  # an edit is not a fill


def test_a_filled_job_shows_the_files_of_what_its_widgets_hold(job):
    """A float box holds 6 digits: an uploaded 1.2345678e-4 is shown, and run, as 0.000123457."""
    from tunedeck.backend.fields import spec_from_values, values_from_form

    uploaded = set_paths(JobSpec(), {"training.learning_rate": 1.2345678e-4})
    out = job.on_fill(uploaded, JobEvent(form_of(JobSpec()), {}, 0, []))
    widgets = [update["value"] for update in out[: len(FORM_FIELDS)]]
    what_start_runs = spec_from_values(values_from_form(widgets))  # page.on_start reads the widgets
    assert output(job, out, job.digest) == bundle_digest(render_bundle(what_start_runs))


def test_start_gets_the_forms_job_only_while_the_files_shown_are_that_jobs(job):
    demo = load_presets()["demo"].build()
    shown = bundle_digest(render_bundle(demo))
    assert job.spec_as_shown(form_of(demo), shown) == demo
    edited = set_paths(demo, {"training.max_steps": 3})  # typed, its files still on their way
    with pytest.raises(NotShownYet, match="press Start again"):
        job.spec_as_shown(form_of(edited), shown)
