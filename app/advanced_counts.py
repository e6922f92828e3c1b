"""Each section's "Advanced (N)" counts the fields it shows for the job in the form, not the hidden ones.

A derived view of the job (app/job_events.py): every job event computes the counts from the form's values
and problems by the rule the form shows fields by (form.advanced_shown), and sends an accordion's label only
when its count changed. An accordion with nothing to show for this job is hidden.
"""

from __future__ import annotations

import gradio as gr

from tunedeck.app.form import Form, advanced_label, advanced_shown
from tunedeck.app.job_events import DerivedView
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates
from tunedeck.backend.spec import FIELDS_BY_PATH


class AdvancedCounts(DerivedView):
    def __init__(self, ui: Registry, form: Form):
        self.accordions = form.advanced
        self.inputs = []  # no controls of its own
        self.shown = ui.add("job.advanced_shown", gr.State({}))  # section title -> the count the browser shows
        self.outputs = [*self.accordions.values(), self.shown]

    def context(self, got: Got) -> dict:
        return {}

    def update(self, result: JobResult, got: Got) -> Updates:
        marked = {i.field for i in result.issues if i.field in FIELDS_BY_PATH}  # a field with a problem shows
        counts = advanced_shown(result.values, marked)
        old: dict = got[self.shown] or {}
        out: Updates = {
            accordion: gr.update(label=advanced_label(counts[title]), visible=counts[title] > 0)
            for title, accordion in self.accordions.items()
            if old.get(title) != counts[title]
        }
        if out:
            out[self.shown] = {title: counts[title] for title in self.accordions}
        return out
