"""Issue 8.7: a folder of hostile job files, each through `tunedeck validate`, `tunedeck export`
and the page's upload path. Each gets a message that names the field (or the whole spec, when
the file is not a mapping at all), never a traceback, and no export.

tests/hostile/yaml/ holds the files; EXPECTED below says, per file, which field the message
names and a piece of what it says. A new file without an expectation fails the first test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tunedeck.app.job_outputs import UPLOAD_LIMIT_BYTES, read_uploaded_spec
from tunedeck.app.untrusted_text import as_text

from .helpers import RAW_ERRORS, cli, console, error_fields

FOLDER = Path(__file__).parent / "yaml"
MARKER = Path("/tmp/tunedeck-PWNED")  # what the payload files try to create

# file -> (field named, part of the message). "spec" is the whole file.
EXPECTED = {
    "bidi-override.yaml": ("model.name_or_path", "U+202E (right-to-left override)"),
    "billion-laughs.yaml": ("lol1", "uses the YAML alias *lol0"),
    "binary-junk.yaml": ("spec", "UTF-8"),
    "carriage-return.yaml": ("launch.main_process_ip", "U+000D (carriage return)"),
    "custom-tag.yaml": ("training.seed", "the tag !env is not allowed"),
    "deep-mapping-100kb.yaml": ("training.a", "nested more than 10 levels deep"),
    "deep-nesting-3000.yaml": ("model.name_or_path", "nested more than 10 levels deep"),
    "duplicate-keys.yaml": ("model.name_or_path", "given twice (lines 2 and 4)"),
    "duplicate-sections.yaml": ("training", "given twice (lines 1 and 5)"),
    "escape-sequence-key.yaml": ("model.\\x1b[2J\\x1b[31mname", "unknown field"),
    "huge-int.yaml": ("training.seed", "exceeded maximum size"),
    "inf-epochs.yaml": ("training.num_train_epochs", "finite number"),
    "line-separator.yaml": ("output_dir", "U+2028 (line separator)"),
    "list-for-scalar.yaml": ("training.learning_rate", "valid number"),
    "lone-surrogate.yaml": ("dataset.name", "U+D800 (lone surrogate)"),
    "long-value-100kb.yaml": ("model.name_or_path", "is 100,000 characters long"),
    "many-unknown-keys.yaml": ("key0", "unknown field"),
    "mapping-for-list.yaml": ("lora.target_modules", "all-linear"),
    "max-steps-absurd.yaml": ("training.max_steps", "less than or equal to 10000000"),
    "merge-key-bomb.yaml": ("training.<<", "uses the YAML alias *m"),
    "newline-injection.yaml": ("model.name_or_path", "U+000A (line feed)"),
    "nul-byte-raw.yaml": ("model.name_or_path", "U+0000 (NUL) on line 2"),
    "nul-escaped.yaml": ("dataset.path", "U+0000 (NUL)"),
    "output-dir-escape.yaml": ("output_dir", "'..' leads out of the run folder"),
    "python-object-tag.yaml": ("model", "the tag !!python/object/apply:os.system is not allowed"),
    "seed-too-large.yaml": ("training.seed", "less than or equal to 4294967295"),
    "tab-in-value.yaml": ("dataset.split", "U+0009 (tab)"),
    "tab-indentation.yaml": ("model", "found character '\\t' that cannot start any token at line 2"),
    "top-level-list.yaml": ("spec", "a job spec is a YAML mapping"),
    "top-level-scalar.yaml": ("spec", "a job spec is a YAML mapping"),
    "two-documents.yaml": ("spec", "expected a single document"),
}
FILES = sorted(path.name for path in FOLDER.glob("*.yaml"))


def test_every_file_has_an_expectation_and_passes_the_upload_size_limit():
    assert sorted(EXPECTED) == FILES
    assert all((FOLDER / name).stat().st_size <= UPLOAD_LIMIT_BYTES for name in FILES)
    assert (FOLDER / "deep-mapping-100kb.yaml").stat().st_size >= 100_000


@pytest.fixture(autouse=True)
def no_marker():
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "a payload in a job file ran"


def assert_named(stderr: str, field: str, fragment: str) -> None:
    assert field in error_fields(stderr), stderr[:2000]
    assert fragment in stderr, stderr[:2000]
    assert not any(raw in stderr for raw in RAW_ERRORS), stderr[:2000]
    assert "\x1b" not in stderr and "\0" not in stderr  # nothing from the file drives the terminal


@pytest.mark.parametrize("name", FILES)
def test_validate_and_export_name_the_field_and_write_nothing(tmp_path, name):
    field, fragment = EXPECTED[name]
    code, out, err = cli("validate", str(FOLDER / name))
    assert code == 2 and not out
    assert_named(err, field, fragment)
    assert len(err.splitlines()) <= 21  # 2,000 unknown keys: the first 20 and a count

    code, _, err = cli("export", str(FOLDER / name), "-o", str(tmp_path / "bundle"))
    assert code == 2
    assert_named(err, field, fragment)
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("name", FILES)
def test_upload_names_the_field_and_loads_nothing(name):
    field, fragment = EXPECTED[name]
    message, spec = read_uploaded_spec(str(FOLDER / name))
    assert spec is None
    assert not any(raw in message for raw in RAW_ERRORS), message[:2000]
    if name == "binary-junk.yaml":
        assert "is not a text file" in message
        return
    assert "was not loaded; the form is unchanged" in message
    shown_field = "job" if field == "spec" else field
    assert f"`{shown_field}`" in message or as_text(shown_field) in message, message[:2000]
    assert as_text(fragment) in message, message[:2000]
    assert "\x1b" not in message and "\0" not in message


def test_many_problems_are_summed_up():
    code, _, err = cli("validate", str(FOLDER / "many-unknown-keys.yaml"))
    assert code == 2
    assert err.splitlines()[-1] == "error: spec: and 1980 more problems like these"


@pytest.mark.parametrize(
    "command, name",
    [
        ("validate", "deep-nesting-3000.yaml"),
        ("validate", "huge-int.yaml"),
        ("validate", "nul-byte-raw.yaml"),
        ("export", "python-object-tag.yaml"),
        ("export", "newline-injection.yaml"),
    ],
)
def test_the_console_script_exits_2_with_the_field(tmp_path, command, name):
    field, fragment = EXPECTED[name]
    extra = ["-o", str(tmp_path / "bundle")] if command == "export" else []
    result = console(command, str(FOLDER / name), *extra)
    assert result.returncode == 2, result.stderr[-2000:]
    assert_named(result.stderr, field, fragment)
    assert not (tmp_path / "bundle").exists()


def test_a_too_deep_value_is_named_by_its_field_in_every_section_of_sections():
    """The refusal of a value nested too deep names the field it was given for: the spec's sections of sections
    (launch.slurm.ssh, training.health, ...) are all known to the loader that counts the keys."""
    from tunedeck.backend.spec import FORM_FIELDS, SpecError, spec_from_yaml

    nested = {tuple(f.path.split(".")[:-1]) for f in FORM_FIELDS if f.path.count(".") >= 2}
    for section in sorted(nested):
        field = next(f.path for f in FORM_FIELDS if tuple(f.path.split(".")[:-1]) == section)
        keys = field.split(".")
        text = "".join(f"{'  ' * depth}{key}:\n" for depth, key in enumerate(keys[:-1]))
        text += f"{'  ' * (len(keys) - 1)}{keys[-1]}: {'[' * 20}{']' * 20}\n"
        try:
            spec_from_yaml(text)
        except SpecError as exc:
            assert [p.field for p in exc.problems] == [field], (field, exc.problems)
        else:
            raise AssertionError(f"{field}: a value nested 20 deep was accepted")
