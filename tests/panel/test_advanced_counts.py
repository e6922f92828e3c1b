"""Each section's "Advanced (N)" counts the fields it shows for the job, not the hidden ones (issue 31)."""

from __future__ import annotations

import gradio as gr

from tunedeck.app.advanced_counts import AdvancedCounts
from tunedeck.app.form import build_form
from tunedeck.app.job_outputs import evaluate
from tunedeck.app.registry import Registry
from tunedeck.backend.spec import JobSpec, load_presets, set_paths
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_spec, visible


def shown_advanced(values, section: str) -> int:
    """How many of a section's Advanced fields the form shows for these values (the fields' own rule)."""
    return sum(visible(f.path, values) for f in FORM_FIELDS if f.section == section and not f.basic)


def test_advanced_counts_only_the_fields_shown_and_sends_a_label_only_when_its_count_changes():
    demo = load_presets()["demo"].build()
    with gr.Blocks():
        ui = Registry()
        form = build_form({f.path: f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(JobSpec()).values())}, ui)
        counts = AdvancedCounts(ui, form)
    advanced = {title: sum(f.section == title and not f.basic for f in FORM_FIELDS) for title in form.advanced}
    assert (
        advanced["Training"] == 32
    )  # whatever the job (SimPO added preference.simpo_gamma, issue 34 training.health.*)

    values = values_from_spec(demo)
    first = counts.update(evaluate(values), {counts.shown: {}})
    labels = {title: first[accordion]["label"] for title, accordion in form.advanced.items()}
    assert labels["Training"] == f"Advanced ({shown_advanced(values, 'Training')})" == "Advanced (20)"
    assert first[form.advanced["Strategy"]]["visible"] is False  # DDP: none of its Advanced fields applies
    assert all(labels[t] == f"Advanced ({shown_advanced(values, t)})" for t in form.advanced)

    # ZeRO-3: the Strategy section's Advanced fields show; only the labels whose count changed are sent again.
    zero3 = values_from_spec(set_paths(demo, {"strategy.kind": "zero3"}))
    again = counts.update(evaluate(zero3), {counts.shown: first[counts.shown]})
    sent = {title for title, accordion in form.advanced.items() if accordion in again}
    changed = {t for t in form.advanced if shown_advanced(zero3, t) != shown_advanced(values, t)}
    assert sent == changed and "Strategy" in sent and "Model" not in sent
    assert again[form.advanced["Strategy"]]["visible"] is True
    assert again[form.advanced["Strategy"]]["label"] == f"Advanced ({shown_advanced(zero3, 'Strategy')})"
    assert counts.update(evaluate(zero3), {counts.shown: again[counts.shown]}) == {}  # nothing changed
