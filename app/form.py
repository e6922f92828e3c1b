"""The job form: one Gradio component per spec field, grouped in section tabs.

Components come from backend.fields (the spec's own registry): widget kind from the
field type, label from its title, help text from its description, with the raw key as a
small code hint after the help. Each section shows its basic fields in a grid and folds the
others into an Advanced accordion. Nothing here is written per field. Each field is
registered as `job.<its spec path>` (e.g. `job.lora.r`).

A field with a problem gets the class `invalid` (an error) or `warned`, which page.py's CSS
draws as an outline, and its problem in place of its help; its section's tab counts them
("Training ✗2"). form_marks.py computes those looks.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any, TypedDict

import gradio as gr
from gradio.components import Component

from tunedeck.app.registry import Got, Registry
from tunedeck.backend.spec import (
    FORM_FIELDS,
    FormField,
    Values,
    choice_text,
    section_shown,
    section_titles,
    values_from_form,
    visible,
)


def element_id(path: str) -> str:
    """DOM id of a field's component (tests and CSS find fields by their spec path)."""
    return "field-" + path.replace(".", "-").replace("_", "-")


def section_id(title: str) -> str:
    """DOM id of a section's tab panel (its tab button is this id + `-button`)."""
    return "section-" + "".join(c if c.isalnum() else "-" for c in title.split()[0].lower())


def advanced_id(title: str) -> str:
    """DOM id of a section's Advanced accordion."""
    return section_id(title) + "-advanced"


def info_text(field: FormField, says: str | None = None) -> str:
    """What a field shows under its label: its problem (`says`) or its help, then its raw key as a hint.

    Gradio renders `code` in info text, so the key reads as a small code span (CSS: .info-text code).
    """
    return f"{says or field.help} `{field.path}`"


class _Common(TypedDict):
    """What every field's component gets, whatever its widget."""

    label: str
    info: str
    elem_id: str
    interactive: bool


def _component(field: FormField, value: Any) -> Component:
    common = _Common(label=field.label, info=info_text(field), elem_id=element_id(field.path), interactive=True)
    if field.kind == "bool":
        return gr.Checkbox(value=value, **common)
    if field.kind == "choice":
        choices = [("(none)", "") if c is None else (choice_text(c), field.to_form(c)) for c in field.choices]
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
    components: list[Component]  # in FORM_FIELDS order
    section_tabs: dict[str, gr.Tab]
    advanced: dict[str, gr.Accordion] = field(default_factory=dict)  # section title -> its Advanced accordion

    def raw(self, got: Got) -> list:
        """The widgets' values in FORM_FIELDS order, from a listener's inputs."""
        return [got[c] for c in self.components]

    def values(self, got: Got) -> Values:
        """The spec values the form holds, from a listener's inputs."""
        return values_from_form(self.raw(got))


def jump_targets() -> dict[str, list]:
    """{field's DOM id: [its tab button's id, its Advanced accordion's id or None]}: what the page's
    jump script opens before it scrolls to a field (form_marks.JUMP_JS)."""
    return {
        element_id(f.path): [section_id(f.section) + "-button", None if f.basic else advanced_id(f.section)]
        for f in FORM_FIELDS
    }


def advanced_shown(values: Values, marked: Set[str] = frozenset()) -> dict[str, int]:
    """{section title: how many of its Advanced fields show for this job}: as job_view shows a field, one that
    applies or holds a value where it does not (fields.visible), or has a problem (`marked`)."""
    counts: dict[str, int] = {}
    for f in FORM_FIELDS:
        if not f.basic:
            counts[f.section] = counts.get(f.section, 0) + (visible(f.path, values) or f.path in marked)
    return counts


def advanced_label(count: int) -> str:
    """The Advanced accordion's label: the fields it holds for this job, not those hidden (issue 31)."""
    return f"Advanced ({count})"


def _grid(ui: Registry, fields: list[FormField], initial: dict[str, Any], out: dict) -> None:
    with gr.Column(elem_classes=["field-grid"]):
        for field in fields:
            out[field.path] = ui.add(field_id(field.path), _component(field, initial.get(field.path)))


def build_form(initial: dict[str, Any], ui: Registry) -> Form:
    """Render the form inside the current Blocks context; `initial` holds widget values by path."""
    components: dict[str, Component] = {}
    tabs: dict[str, gr.Tab] = {}
    accordions: dict[str, gr.Accordion] = {}
    counts = advanced_shown(values_from_form([initial.get(f.path) for f in FORM_FIELDS]))
    with gr.Tabs(elem_id="form-sections", overflow_behavior="wrap"):
        for title in section_titles():
            with ui.add(
                "job.section." + section_id(title).removeprefix("section-"),
                gr.Tab(title, elem_id=section_id(title), visible=section_shown(title, initial)),
            ) as tab:
                tabs[title] = tab
                fields = [f for f in FORM_FIELDS if f.section == title]
                _grid(ui, [f for f in fields if f.basic], initial, components)
                advanced = [f for f in fields if not f.basic]
                if advanced:
                    label = advanced_label(counts[title])
                    with ui.add(
                        "job.advanced." + section_id(title).removeprefix("section-"),
                        gr.Accordion(label, open=False, elem_id=advanced_id(title)),
                    ) as accordions[title]:
                        _grid(ui, advanced, initial, components)
    return Form([components[f.path] for f in FORM_FIELDS], tabs, accordions)
