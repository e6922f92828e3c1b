"""Issue 8.7 and 8.8: hostile values from the CLI and the form are field-named errors, and the
spec refuses jobs that cannot run or that write outside the run folder.
"""

from __future__ import annotations

import os

import psutil
import pytest

from tunedeck.app.job_outputs import evaluate, issues_markdown
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.spec import FIELD_PATHS, JobSpec, SpecError, field_info, resolve_spec, set_paths
from tunedeck.backend.spec.fields import FIELDS_BY_PATH, FORM_FIELDS, values_from_form, values_from_spec
from tunedeck.backend.validate import CPU_RANK_BYTES, validate

from .helpers import RAW_ERRORS, cli, error_fields

HUGE = "9" * 5000  # past Python's 4,300-digit limit of int("...")
DEEP = "[" * 3000 + "]" * 3000  # past the YAML composer's recursion


@pytest.mark.parametrize(
    "assignment, field",
    [
        ('model.name_or_path="meta\\0llama"', "model.name_or_path"),  # a NUL through a YAML escape
        (f"training.seed={HUGE}", "training.seed"),
        (f"strategy.reduce_bucket_size={HUGE}", "strategy.reduce_bucket_size"),
        (f"model.revision={HUGE}", "model.revision"),  # a text field keeps the digits, then finds them too long
        (f"lora.target_modules={DEEP}", "lora.target_modules"),
        (f"training.learning_rate={DEEP}", "training.learning_rate"),
        ("training.seed=*alias", "training.seed"),
        ("training.seed=!!python/object/apply:os.system [true]", "training.seed"),
    ],
)
def test_hostile_set_values_exit_2_naming_the_field(tmp_path, assignment, field):
    for command in (["validate", "demo"], ["export", "demo", "-o", str(tmp_path / "out")]):
        code, _, err = cli(*command, "--set", assignment)
        assert code == 2, err
        assert error_fields(err) == [field], err
        assert not any(raw in err for raw in RAW_ERRORS), err
    assert not (tmp_path / "out").exists()


def form_raw(spec: JobSpec) -> list:
    """What the page's widgets hold for a spec: the raw list values_from_form reads."""
    values = values_from_spec(spec)
    return [f.to_form(values[f.path]) for f in FORM_FIELDS]


@pytest.mark.parametrize(
    "path, raw, fragment",
    [
        ("model.name_or_path", "meta\0llama", "U+0000 (NUL)"),
        ("dataset.path", "data\u2028.jsonl", "U+2028 (line separator)"),
        ("training.seed", 1e308, "less than or equal to 4294967295"),  # a Number widget's largest float
        ("training.max_steps", float("inf"), "finite number"),
        ("strategy.reduce_bucket_size", HUGE, "exceeded maximum size"),
        ("strategy.reduce_bucket_size", "²", "auto"),  # "²".isdigit() is True, int("²") raises
        ("lora.target_modules", "q_proj, v\x1bproj", "item 2 contains U+001B (escape)"),
        ("output_dir", "../../elsewhere", "'..' leads out of the run folder"),
    ],
)
def test_hostile_form_values_are_field_named_problems(path, raw, fragment):
    raw_values = form_raw(resolve_spec("demo"))
    raw_values[[f.path for f in FORM_FIELDS].index(path)] = raw
    result = evaluate(values_from_form(raw_values))
    assert result.error_fields == {path} and result.spec is None and result.files == {}
    text = issues_markdown(result)
    assert as_text(fragment) in text and not any(raw_error in text for raw_error in RAW_ERRORS)


def test_deeply_nested_form_value_is_a_field_named_problem():
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    values = values_from_spec(resolve_spec("demo")) | {"lora.target_modules": deep, "model.revision": deep}
    result = evaluate(values)
    assert result.error_fields == {"lora.target_modules", "model.revision"}


@pytest.mark.parametrize("value", ["../../x", "out/../../x", "..", ".", "./", "a/./.."])
def test_output_dir_cannot_leave_the_run_folder(value):
    with pytest.raises(SpecError) as refused:
        set_paths(JobSpec(), {"output_dir": value})
    assert [p.field for p in refused.value.problems] == ["output_dir"]


@pytest.mark.parametrize("value", ["output", "out/run-1", "/data/checkpoints", "~/checkpoints", "a..b"])
def test_output_dir_inside_or_absolute_is_accepted(value):
    assert set_paths(JobSpec(), {"output_dir": value}).output_dir == value
    assert "absolute path" in field_info("output_dir").description  # the user chose it, the page shows it


def test_seed_is_bounded_by_what_numpy_accepts():
    assert set_paths(JobSpec(), {"training.seed": 2**32 - 1}).training.seed == 2**32 - 1
    with pytest.raises(SpecError) as refused:
        set_paths(JobSpec(), {"training.seed": 2**32})
    assert refused.value.problems[0].field == "training.seed"


NUMERIC = [f.path for f in FORM_FIELDS if f.kind in ("int", "float") or f.accepts_int]


@pytest.mark.parametrize("path", NUMERIC)
def test_every_numeric_field_has_bounds(path):
    """No form number is unbounded: 10^30 steps, buckets or ranks is refused by the field itself."""
    for absurd in (10**30, -(10**30)):
        with pytest.raises(SpecError) as refused:
            set_paths(JobSpec(), {path: absurd})
        assert [p.field for p in refused.value.problems] == [path]


def test_numeric_fields_are_all_covered():
    assert {
        "training.max_steps",
        "training.logging_steps",
        "training.save_steps",
        "training.eval_steps",
        "training.warmup_steps",
        "training.num_train_epochs",
        "launch.machine_rank",
        "strategy.reduce_bucket_size",
        "strategy.allgather_bucket_size",
    } <= set(NUMERIC)
    assert set(NUMERIC) <= set(FIELD_PATHS)


def cpu_problems(processes: int):
    spec = resolve_spec("demo", [f"launch.num_processes={processes}"])
    return [(p.level, p.message) for p in validate(spec) if p.field == "launch.num_processes"]


def test_cpu_processes_are_checked_against_this_machine():
    cores = len(os.sched_getaffinity(0))
    assert cpu_problems(min(2, cores)) == []  # the demo's 2 ranks on a 2-core machine
    assert cpu_problems(cores) == []
    [(level, message)] = cpu_problems(cores + 1)
    assert level == "warning" and f"{cores} cores" in message
    [(level, message)] = cpu_problems(65536)
    assert level == "error" and "GiB of RAM" in message
    most = psutil.virtual_memory().total // CPU_RANK_BYTES
    assert f"at most {most}" in message
    code, _, err = cli("export", "demo", "--set", "launch.num_processes=65536", "-o", "/nonexistent/never")
    assert code == 2 and error_fields(err) == ["launch.num_processes"]


def test_gpu_processes_are_not_held_to_this_machine():
    spec = resolve_spec(
        "7b-lora-ddp", ["launch.num_processes=64", "launch.num_machines=8", "launch.main_process_ip=10.0.0.1"]
    )
    assert not [p for p in validate(spec) if p.field == "launch.num_processes"]
    assert FIELDS_BY_PATH["launch.num_processes"].kind == "int"
