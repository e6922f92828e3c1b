"""The job form: one Gradio component per spec field, grouped in section tabs.

Components come from backend.fields (the spec's own registry): widget kind from the
field type, label from its name, help text from its description. Nothing here is
written per field. Each field is registered as `job.<its spec path>` (e.g. `job.lora.r`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from tunedeck.app.registry import Got, Registry
from tunedeck.backend.fields import FORM_FIELDS, FormField, Values, section_titles, values_from_form


def element_id(path: str) -> str:
    """DOM id of a field's component (tests and CSS find fields by their spec path)."""
    return "field-" + path.replace(".", "-").replace("_", "-")


def _component(field: FormField, value: Any) -> gr.components.Component:
    common = dict(label=field.label, info=field.help, elem_id=element_id(field.path), interactive=True)
    if field.kind == "bool":
        return gr.Checkbox(value=value, **common)
    if field.kind == "choice":
        choices = [("(none)" if c is None else str(c), "" if c is None else c) for c in field.choices]
        return gr.Dropdown(choices=choices, value=value, filterable=False, **common)
    if field.kind == "int":
        return gr.Number(value=value, precision=0, **common)
    return gr.Textbox(value=value, max_lines=1, **common)


FIELD_PREFIX = "job."


def field_id(path: str) -> str:
    """Registry id of a field's component: `job.` and its spec path."""
    return FIELD_PREFIX + path


@dataclass
class Form:
    components: list[gr.components.Component]  # in FORM_FIELDS order
    section_tabs: dict[str, gr.Tab]

    def raw(self, got: Got) -> list:
        """The widgets' values in FORM_FIELDS order, from a listener's inputs."""
        return [got[c] for c in self.components]

    def values(self, got: Got) -> Values:
        """The spec values the form holds, from a listener's inputs."""
        return values_from_form(self.raw(got))


def build_form(initial: dict[str, Any], ui: Registry) -> Form:
    """Render the form inside the current Blocks context; `initial` holds widget values by path."""
    components: dict[str, gr.components.Component] = {}
    tabs: dict[str, gr.Tab] = {}
    with gr.Tabs(elem_id="form-sections", overflow_behavior="wrap"):
        for title in section_titles():
            with gr.Tab(title, elem_id="section-" + title.split()[0].lower()) as tab:
                tabs[title] = tab
                for field in FORM_FIELDS:
                    if field.section == title:
                        components[field.path] = ui.add(
                            field_id(field.path), _component(field, initial.get(field.path))
                        )
    return Form(components=[components[f.path] for f in FORM_FIELDS], section_tabs=tabs)
