"""Reading and naming a job spec: YAML and dicts in and out, `--set a.b=value`, the field
registry that the form, `--set`, validation and the docs walk, and errors that name the field.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tunedeck.backend.spec.job import JobSpec
from tunedeck.backend.spec.problem import Problem, error
from tunedeck.backend.spec.sections import SFT_CONFIG
from tunedeck.backend.spec.untrusted import YamlRefused, load_yaml, shown, unsafe_char

# ---------------------------------------------------------------- YAML round trip


def spec_to_dict(spec: JobSpec) -> dict:
    return spec.model_dump(mode="json")


def spec_to_yaml(spec: JobSpec) -> str:
    return yaml.safe_dump(spec_to_dict(spec), sort_keys=False, allow_unicode=True)


def spec_from_dict(data: dict) -> JobSpec:
    return JobSpec.model_validate(data)


def spec_from_yaml(text: str) -> JobSpec:
    """Parse YAML text into a JobSpec. Raises SpecError with field-level messages."""
    try:
        data = load_yaml(text)
    except YamlRefused as exc:
        raise SpecError([error(exc.path, exc.message)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([error("", "a job spec is a YAML mapping (key: value lines) at the top level")])
    return parse_spec(data)


def load_spec_file(path: str | Path) -> JobSpec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, or not a text file at all
        raise SpecError([error("", f"cannot read {path} as a UTF-8 YAML job spec: {exc}")]) from None
    return spec_from_yaml(text)


# ---------------------------------------------------------------- errors people can act on


class SpecError(ValueError):
    """A spec that does not parse: its problems, each an error naming its dotted field path ("" for the whole
    spec), the same shape validation's and Start's problems have."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(f"{p.field or 'spec'}: {p.message}" for p in problems))


def _describe_pydantic_error(err: ErrorDetails) -> tuple[str, str]:
    # Union members add their type to the location ("target_modules.list[str]"): keep field names only.
    path = ".".join(str(p) for p in err["loc"] if isinstance(p, str) and p in _ALL_FIELD_NAMES)
    if err["type"] == "extra_forbidden":
        path = ".".join(shown(p) for p in err["loc"])  # the input's own key: may hold anything
        return path, "unknown field; check its spelling (`tunedeck schema` lists every field)"
    # A check of ours raised ValueError: its message without pydantic's "Value error, " prefix.
    msg = str(err.get("ctx", {}).get("error")) if err["type"] == "value_error" else err["msg"]
    field = field_info(path)
    if field is not None and field.description:
        msg = f"{msg}. ({field.description})"
    return path, msg


MAX_PROBLEMS = 20  # a file of 10,000 unknown keys gets a readable answer, not 10,000 lines


def parse_spec(data: dict) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        seen: dict[str, str] = {}
        for err in exc.errors(include_input=False, include_url=False):
            path, msg = _describe_pydantic_error(err)
            seen.setdefault(path, msg)  # one message per field: union members repeat themselves
        problems = [error(path, msg) for path, msg in seen.items()]
        if len(problems) > MAX_PROBLEMS:
            problems = problems[:MAX_PROBLEMS] + [
                error("", f"and {len(problems) - MAX_PROBLEMS} more problems like these")
            ]
        raise SpecError(problems) from None


# ---------------------------------------------------------------- field registry


def iter_fields(model: type[BaseModel] = JobSpec, prefix: str = ""):
    """Yield (dotted_path, FieldInfo) for every leaf field of the spec, in declaration order.

    The form, `--set` and the docs all come from this one walk.
    """
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from iter_fields(annotation, prefix=f"{path}.")
        else:
            yield path, info


def field_info(path: str):
    """FieldInfo of a dotted leaf path, or None when there is no such field."""
    model: type[BaseModel] = JobSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        if i == len(parts) - 1:
            return info
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return None


FIELD_PATHS = [path for path, _ in iter_fields()]
_ALL_FIELD_NAMES = {part for path in FIELD_PATHS for part in path.split(".")}


def get_path(spec: JobSpec, path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def flat_values(spec: JobSpec) -> dict[str, Any]:
    """{dotted path: value} of every field: the flat shape the form and the applicability table use."""
    return {path: get_path(spec, path) for path in FIELD_PATHS}


def sft_name(path: str) -> str | None:
    """The TRL SFTConfig argument a field is copied to (its SftField declaration), or None."""
    extra = getattr(field_info(path), "json_schema_extra", None)
    mark = extra.get(SFT_CONFIG) if isinstance(extra, dict) else None
    return path.rsplit(".", 1)[-1] if mark is True else mark


def set_paths(spec: JobSpec | dict, assignments: dict[str, Any]) -> JobSpec:
    """Return a new spec with dotted paths set, validated as a whole.

    Values may be strings (from --set or a form); they are read as YAML scalars
    so "8", "true", "null" and "[q_proj, v_proj]" become the right types.
    Raises SpecError naming the field.
    """
    data = copy.deepcopy(spec_to_dict(spec) if isinstance(spec, JobSpec) else spec)
    problems = []
    for path, value in assignments.items():
        if path not in FIELD_PATHS:
            problems.append(error(shown(path), f"unknown field; known fields: {', '.join(_close_matches(path))}"))
            continue
        if isinstance(value, str):
            value = _read_scalar(value, keep_text=_takes_text(path))
        set_dotted(data, path, value)
    if problems:
        raise SpecError(problems)
    return parse_spec(data)


def set_dotted(data: dict, path: str, value: Any) -> None:
    """data["a"]["b"] = value for path "a.b", creating the sections on the way."""
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def parse_assignments(items: list[str]) -> dict[str, str]:
    """Turn ["a.b=1", ...] into {"a.b": "1"}; raises SpecError on a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise SpecError([error(shown(item), "expected dotted.path=value, e.g. --set strategy.kind=zero2")])
        out[path.strip()] = value.strip()
    return out


def _read_scalar(text: str, keep_text: bool = False) -> Any:
    if text == "":
        return None
    if unsafe_char(text) is not None:  # YAML would fold a raw line break into a space: keep it, to be refused
        return text
    try:
        value = load_yaml(text)
    except YamlRefused:  # not YAML (or nested, aliased, ...): the text as typed, which the field's type then judges
        return text
    # A text field keeps what was typed: a revision 0123456, a split or folder named 2024.
    if keep_text and value is not None and not isinstance(value, str):
        return text
    return value


def _takes_text(path: str) -> bool:
    """The field is plain text (str or str | None), not a choice, number or list."""
    info = field_info(path)
    annotation = info.annotation if info else None
    return annotation is str or (get_origin(annotation) in (Union, UnionType) and str in get_args(annotation))


def _close_matches(path: str) -> list[str]:
    return difflib.get_close_matches(path, FIELD_PATHS, n=3, cutoff=0.5) or FIELD_PATHS[:5] + ["..."]
