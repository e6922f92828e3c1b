"""Property: any hostile value in any spec field, through every front door, is either a job or a
field-named refusal. Never a traceback, never an export of a refused spec, never a payload run.

Hypothesis draws one to three fields of the spec and gives each a hostile value: shell payloads
and control characters, lone surrogates, 5,000-character text, integers of 5,000 digits, huge
and negative numbers, inf and nan, lists and mappings where a scalar goes, nesting 3,000 deep.
Each example goes through:

- the CLI's `--set` (backend.cli.main in-process: export, then the bundle's launch.sh runs),
- the CLI's SPEC file, the same values written into a job.yaml,
- the page's upload (app.job_outputs.read_uploaded_spec) of that job.yaml,
- the page's form (values_from_form, then app.job_outputs.evaluate, as each edit does).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tunedeck.app.job_outputs import evaluate, issues_markdown, read_uploaded_spec
from tunedeck.backend.render import zip_bundle
from tunedeck.backend.spec import FIELD_PATHS, resolve_spec, spec_to_dict
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_form, values_from_spec
from tunedeck.backend.spec.untrusted import unsafe_char

from .helpers import RAW_ERRORS, cli, error_fields, install_stand_ins
from .test_shell_payloads import TEXT_FIELDS

MARKER = Path(tempfile.gettempdir()) / "tunedeck-property-PWNED"
DEMO = resolve_spec("demo")
FORM_PATHS = [f.path for f in FORM_FIELDS]


@dataclass(frozen=True)
class Hostile:
    """A value as Python holds it (form, evaluate) and as YAML text (--set, job.yaml)."""

    python: Any
    text: str

    def __repr__(self) -> str:  # hypothesis prints failing examples: keep 5,000 digits out of it
        return f"Hostile({self.text[:80]!r}{'...' if len(self.text) > 80 else ''})"


def as_yaml(value: Any) -> str:
    style = '"' if isinstance(value, str) else None  # double-quoted: every control character escaped
    text = yaml.safe_dump(value, default_style=style, default_flow_style=True, width=float("inf"))
    return text.removesuffix("\n...\n").strip()


def plain(value: Any) -> Hostile:
    return Hostile(value, as_yaml(value))


def nested(depth: int) -> Hostile:
    value: list = []
    for _ in range(depth):
        value = [value]
    return Hostile(value, "[" * depth + "]" * depth)


PAYLOADS = [
    "$(touch {m})",
    "`touch {m}`",
    "'; touch {m}; '",
    '"; touch {m}; "',
    "x; touch {m} #",
    "# $(touch {m})",
    "x\ntouch {m} #",
    "x\rtouch {m}",
    "x\0y",
    "x\u2028touch {m}",
    "x\x85y",
    "\x1b[2J",
    "a\tb",
    "\ud800",
    "../../x",
    "/abs/dir",
    "~",
    ".",
    "",
    " ",
    "-1",
    "1e999",
    "nan",
    ".inf",
    "*alias",
    "&a x",
    "{a: 1}",
    "[1, 2]",
    "null",
    "true",
    "0x1F",
    "0o17",
    "1_000",
    "９",
    "²",
    "auto",
    "all-linear",
    "a" * 5000,
]
texts = st.one_of(
    st.sampled_from(PAYLOADS).map(lambda p: p.replace("{m}", str(MARKER))),
    st.text(max_size=24),  # any code point: controls, separators, surrogates, astral
)
numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([0, -1, 1, 2**32, 2**63, 10**12 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
hostile_values = st.one_of(
    texts.map(plain),
    texts.map(plain),  # twice: text is the likeliest attack
    numbers.map(plain),
    wrong_types.map(plain),
    st.just(Hostile(10**5000 - 1, "9" * 5000)),  # past int()'s 4,300-digit limit
    st.sampled_from([20, 3000]).map(nested),
)
# Half the draws pick a text field: those are where a payload could reach a script.
fields = st.one_of(st.sampled_from(TEXT_FIELDS), st.sampled_from(FIELD_PATHS))
assignments = st.dictionaries(fields, hostile_values, min_size=1, max_size=3)


def job_yaml(chosen: dict[str, Hostile]) -> str:
    """The demo job as a job.yaml, with the chosen fields' values written in as YAML text."""
    data = spec_to_dict(DEMO)
    for index, path in enumerate(chosen):
        *sections, leaf = path.split(".")
        target = data
        for section in sections:  # launch.slurm.* sits two sections deep
            target = target[section]
        target[leaf] = f"HOSTILE{index}"
    text = yaml.safe_dump(data, sort_keys=False)
    for index, value in enumerate(chosen.values()):
        text = text.replace(f"HOSTILE{index}\n", value.text + "\n", 1)
    return text


def assert_refusal_names_fields(stderr: str) -> None:
    fields = error_fields(stderr)
    assert fields and set(fields) <= set(FIELD_PATHS) | {"spec"}, stderr[:3000]
    assert not any(raw in stderr for raw in RAW_ERRORS), stderr[:3000]


def texts_of(value: Any):
    if isinstance(value, dict):
        for item in value.values():
            yield from texts_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from texts_of(item)
    elif isinstance(value, str):
        yield value


def assert_accepted_text_is_one_line(spec_dict: dict) -> None:
    """What a spec accepts: every text one line of visible characters (what reaches scripts and files)."""
    for text in texts_of(spec_dict):
        assert unsafe_char(text) is None and len(text) <= 4096, repr(text)[:200]


def run_launch_sh(bundle: Path, bin_dir: Path) -> None:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ACCELERATE": str(bin_dir / "accelerate"), "ARGV_DIR": str(bundle)}
    result = subprocess.run(["bash", str(bundle / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def export_through_cli(spec_args: list[str], bundle: Path, bin_dir: Path) -> int:
    """`tunedeck export`: a refusal names the fields and writes nothing; an export's launch.sh runs no payload."""
    code, _, err = cli("export", *spec_args, "-o", str(bundle))
    assert code in (0, 2), err
    if code == 2:
        assert_refusal_names_fields(err)
        assert not bundle.exists()
    else:
        assert_accepted_text_is_one_line(yaml.safe_load((bundle / "job.yaml").read_text()))
        run_launch_sh(bundle, bin_dir)
    event(f"{'--set' if spec_args[0] == 'demo' else 'job file'}: exit {code}")
    return code


@settings(
    max_examples=int(os.environ.get("TUNEDECK_HOSTILE_EXAMPLES", "120")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(chosen=assignments)
def test_hostile_values_through_every_front_door(chosen):
    note(repr(chosen))
    MARKER.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        bin_dir = install_stand_ins(folder)

        # 1. CLI --set, 2. CLI SPEC file with the same values in a job.yaml.
        sets = [arg for path, value in chosen.items() for arg in ("--set", f"{path}={value.text}")]
        export_through_cli(["demo", *sets], folder / "set", bin_dir)
        job = folder / "job.yaml"
        job.write_text(job_yaml(chosen), encoding="utf-8")
        code = export_through_cli([str(job)], folder / "file", bin_dir)

        # 3. The page's upload of that job.yaml.
        message, spec = read_uploaded_spec(str(job))
        assert not any(raw in message for raw in RAW_ERRORS), message[:3000]
        assert spec is not None or code == 2  # what the upload refuses, the CLI refuses too
        if spec is None:
            assert "was not loaded; the form is unchanged" in message and "`" in message

    # 4. The page's form: the raw widget values, as an edit sends them.
    raw = [values_from_spec(DEMO)[path] for path in FORM_PATHS]
    for path, value in chosen.items():
        raw[FORM_PATHS.index(path)] = value.python
    result = evaluate(values_from_form(raw))
    text = issues_markdown(result)
    assert not any(raw_error in text for raw_error in RAW_ERRORS), text[:3000]
    if result.has_errors:
        assert result.error_fields and result.error_fields <= set(FIELD_PATHS), text[:3000]
        assert result.files == {} or result.spec is not None
    else:
        assert_accepted_text_is_one_line(spec_to_dict(result.spec))
        zip_bundle(result.files)  # every file encodes: no lone surrogate got through
    event(f"form: {'refused' if result.has_errors else 'accepted'}")
    assert not MARKER.exists(), "a payload ran"
