"""What two runs did differently: job.yaml fields that differ where they apply, in the page's line and `runs diff`."""

from __future__ import annotations

import yaml

from runs.helpers import fake_run, tunedeck
from tunedeck.backend.runs.compare import MISSING, differences_line, job_differences
from tunedeck.backend.spec import resolve_spec, set_paths, spec_to_dict


def _job(**changes) -> dict:
    return spec_to_dict(set_paths(resolve_spec("demo"), changes) if changes else resolve_spec("demo"))


def test_differences_are_the_fields_that_apply_to_either_run_in_field_order():
    lora = _job()
    full = _job(**{"method": "full", "training.learning_rate": 1e-5, "dataset.text_field": "body"})
    # lora.r applies to the LoRA run only: still a difference; the text column applies to neither (prompt-completion).
    assert [d[0] for d in job_differences(lora, full)] == ["method", "training.learning_rate"]
    assert job_differences(lora, _job(**{"dataset.text_field": "body"})) == []
    assert ("lora.r", 16, 32) in job_differences(lora, _job(**{"lora.r": 32}))


def test_a_job_from_an_older_tunedeck_lacks_fields_and_they_show_as_missing():
    old = _job()
    del old["training"]["warmup_steps"]
    assert job_differences(old, _job()) == [("training.warmup_steps", MISSING, 0)]
    assert differences_line(job_differences(old, _job())) == "training.warmup_steps - → 0.0"


def test_the_line_names_the_first_differences_and_counts_the_rest():
    many = [(f"training.f{i}", i, i + 1) for i in range(10)]
    line = differences_line(many, most=3)
    assert line == "training.f0 0 → 1 · training.f1 1 → 2 · training.f2 2 → 3 · and 7 more (`tunedeck runs diff`)"
    assert differences_line([("lora.target_modules", ["q_proj"], "all-linear")]) == (
        'lora.target_modules ["q_proj"] → all-linear'
    )
    assert differences_line([]) == "the same job"


def test_runs_diff_prints_a_table_and_refuses_an_unknown_run(tmp_path):
    runs = tmp_path / "runs"
    for run_id, job in [("20250101-120000-aaaaaa", _job()), ("20250101-130000-bbbbbb", _job(**{"lora.r": 8}))]:
        fake_run(runs, run_id, "finished", None).joinpath("job.yaml").write_text(yaml.safe_dump(job))
    done = tunedeck("runs", "diff", "20250101-120000-aaaaaa", "20250101-130000-bbbbbb", "--runs-dir", str(runs))
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines()] == [
        ["FIELD", "20250101-120000-aaaaaa", "20250101-130000-bbbbbb"],
        ["lora.r", "16", "8"],
    ]
    same = tunedeck("runs", "diff", "20250101-120000-aaaaaa", "20250101-120000-aaaaaa", "--runs-dir", str(runs))
    assert same.stdout.strip().endswith("ran the same job")
    missing = tunedeck("runs", "diff", "20250101-120000-aaaaaa", "20990101-000000-cccccc", "--runs-dir", str(runs))
    assert (
        missing.returncode == 2 and missing.stderr.startswith("error: ") and "20990101-000000-cccccc" in missing.stderr
    )
