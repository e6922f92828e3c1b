"""The form's view of the job spec: which widget, which section, and whether a field applies.

Everything here is derived from the JobSpec's own field registry (backend.spec.iter_fields):
the widget kind comes from the field's type, the label from its title, the help text from
its description, Basic or Advanced from its `basic` mark (spec_sections.BASIC), the section
from its top-level key. A field added to the spec appears in the form with no
change here. When a field applies (LoRA knobs only with adapters, ZeRO-3 knobs only with
ZeRO-3, ...) comes from the one applicability table, backend/spec/applies.py, which validation
reads too.

No Gradio here: the panel turns FormField into components, tests read it directly.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from tunedeck.backend.spec.applies import Values, applies
from tunedeck.backend.spec.job import JobSpec
from tunedeck.backend.spec.parse import flat_values, iter_fields, parse_spec, set_dotted
from tunedeck.backend.spec.sections import BASIC_KEY

# Form sections in page order; a field goes to the first section whose prefixes match its path.
SECTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("Model", ("model.",)),
    ("Dataset", ("dataset.",)),
    ("LoRA/Quantization", ("method", "lora.", "quantization.")),
    ("Strategy", ("strategy.",)),
    ("Training", ("objective", "training.", "preference.", "output_dir")),
    ("Rewards", ("grpo.",)),  # GRPO's own: the tab shows only for objective=grpo (form_marks.section_shown)
    ("Hardware/Launch", ("launch.",)),
]
OTHER_SECTION = "Other"


FieldKind = Literal["choice", "bool", "int", "float", "text"]


@dataclass(frozen=True)
class FormField:
    path: str
    section: str
    label: str  # the human label (the field's title); the raw key is only a secondary hint
    help: str  # one line (the field's description)
    kind: FieldKind  # float is typed as text: "2e-4" works
    choices: tuple = ()  # for "choice": the allowed values, None first when the field is optional
    optional: bool = False  # None is allowed (shown as an empty box or "(none)")
    accepts_int: bool = False  # a text box that may hold a number, e.g. Union[int, Literal["auto"]]
    default: Any = None
    basic: bool = False  # in the section's first view; the others fold into its Advanced part

    @property
    def key(self) -> str:
        """The raw key as YAML and --set spell it (the last part of the path)."""
        return self.path.rsplit(".", 1)[-1]

    def to_form(self, value: Any) -> Any:
        """Spec value -> what the widget holds."""
        if value is None:
            return "" if self.kind in ("text", "float", "choice") else None
        if self.kind == "float":
            # Shortest text that reads back as the same float (0.0002, 1e-05, 0.000123456789):
            # "{:g}" would round to 6 digits, so the form would run another value than the spec's.
            text = repr(float(value))
            return text[:-2] if text.endswith(".0") else text
        if self.kind == "text":
            return ", ".join(value) if isinstance(value, list) else str(value)
        if self.kind == "choice" and isinstance(value, bool):
            return choice_text(value)
        return value

    def from_form(self, raw: Any) -> Any:
        """Widget value -> spec value (the spec itself then checks ranges and choices)."""
        if raw is None or (isinstance(raw, str) and raw.strip() == ""):
            return None if (self.optional or self.kind != "text") else ""
        if self.kind == "int" and isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if self.kind == "float" and isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                return raw  # the spec rejects it with the field's name
        if self.kind == "text" and self.accepts_int and isinstance(raw, str):
            text = raw.strip()
            digits = text.replace("_", "")
            # isdigit() is also true of "²" and "٣"; int() takes at most 4,300 digits. Either way
            # the text goes on, and the field's own type check names the field.
            return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else text
        if self.kind == "text" and isinstance(raw, str):
            return raw.strip()
        if self.kind == "choice" and any(c is True for c in self.choices) and raw in ("true", "false"):
            return raw == "true"
        return raw


def choice_text(choice: Any) -> str:
    """A choice as its widget holds and shows it: YAML's spelling for true and false."""
    return str(choice).lower() if isinstance(choice, bool) else str(choice)


def _section_of(path: str) -> str:
    for title, prefixes in SECTIONS:
        if any(path == p or (p.endswith(".") and path.startswith(p)) for p in prefixes):
            return title
    return OTHER_SECTION


def _describe_type(annotation: Any) -> tuple[FieldKind, tuple, bool, bool]:
    """(kind, choices, optional, accepts_int) for a field annotation."""
    origin = typing.get_origin(annotation)
    members = typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)
    optional = type(None) in members
    # Annotated[int, Field(le=...)] is an int with bounds: the widget is the int's.
    members = tuple(typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members)
    members = tuple(m for m in members if m is not type(None))
    literal_values = [a for m in members if typing.get_origin(m) is Literal for a in typing.get_args(m)]
    others = [m for m in members if typing.get_origin(m) is not Literal]
    if literal_values and not others:
        return "choice", ((None,) if optional else ()) + tuple(literal_values), optional, False
    if others == [bool]:  # a checkbox has no "unset": an optional bool (unset = decided by the job) is a choice
        return ("choice", (None, True, False), True, False) if optional else ("bool", (), False, False)
    if others == [int] and not literal_values:
        return "int", (), optional, False
    if others == [float] and not literal_values:
        return "float", (), optional, False
    return "text", (), optional, int in others


def build_fields(model: type[BaseModel] = JobSpec) -> list[FormField]:
    """A FormField for every leaf field of the spec (or of a spec model derived from it), in order."""
    fields = []
    for path, info in iter_fields(model):
        kind, choices, optional, accepts_int = _describe_type(info.annotation)
        fields.append(
            FormField(
                path=path,
                section=_section_of(path),
                label=info.title or "",  # empty: tests/panel/test_field_labels.py names the field
                help=info.description or "",
                kind=kind,
                choices=choices,
                optional=optional,
                accepts_int=accepts_int,
                default=info.get_default(call_default_factory=True),
                basic=isinstance(info.json_schema_extra, dict) and bool(info.json_schema_extra.get(BASIC_KEY)),
            )
        )
    return fields


FORM_FIELDS: list[FormField] = build_fields()
FIELDS_BY_PATH: dict[str, FormField] = {f.path: f for f in FORM_FIELDS}


def section_titles() -> list[str]:
    used = {f.section for f in FORM_FIELDS}
    return [t for t, _ in SECTIONS if t in used] + ([OTHER_SECTION] if OTHER_SECTION in used else [])


def visible(path: str, values: Values) -> bool:
    """Shown in the form: the field applies, or it holds other than its default where it does not, so
    that the person sees the field validation warns about ("ignored: ...") and can set it back."""
    return applies(path, values) or values.get(path) != FIELDS_BY_PATH[path].default


def values_from_spec(spec: JobSpec) -> Values:
    """The spec as the form holds it: {dotted path: value} in FORM_FIELDS order."""
    return flat_values(spec)


def values_from_form(raw: list[Any]) -> Values:
    """Widget values in FORM_FIELDS order -> spec values."""
    return {f.path: f.from_form(r) for f, r in zip(FORM_FIELDS, raw)}


def spec_from_values(values: Values) -> JobSpec:
    """Flat values -> a validated JobSpec; raises SpecError naming each bad field."""
    data: dict = {}
    for path, value in values.items():
        set_dotted(data, path, value)
    return parse_spec(data)


__all__ = [
    "FIELDS_BY_PATH",
    "FORM_FIELDS",
    "FormField",
    "Values",
    "applies",
    "section_titles",
    "spec_from_values",
    "values_from_form",
    "values_from_spec",
    "visible",
]


def section_shown(title: str, values: Values) -> bool:
    """Whether a form section has a field that applies to the job (GRPO's Rewards tab shows only for GRPO)."""
    return any(applies(f.path, values) for f in FORM_FIELDS if f.section == title)
