"""dataset.mix: more training rows from other files or hub datasets, in the job's format.

Its entries, the checks before launch (train.py's own, on each mixed-in file), and the steps the
estimate counts. Loading and sampling with the datasets library: tests/runs/test_dataset_mix.py.
"""

from __future__ import annotations

import json

import pytest

from tunedeck.backend import recipe
from tunedeck.backend.estimate.speed_schedule import dataset_rows
from tunedeck.backend.runs.preflight import preflight
from tunedeck.backend.spec import SpecError, resolve_spec
from tunedeck.backend.spec.fields import FIELDS_BY_PATH
from tunedeck.backend.spec.mix import MixSource, parse_entry


@pytest.mark.parametrize(
    "entry, source",
    [
        ("/data/general.jsonl", MixSource("/data/general.jsonl", None, "train", None)),
        ("/data/general.jsonl#2000", MixSource("/data/general.jsonl", None, "train", 2000)),
        ("HuggingFaceH4/ultrachat_200k:train_sft#5000", MixSource("HuggingFaceH4/ultrachat_200k", None, "train_sft", 5000)),
        ("openai/gsm8k@main:train[:10%]", MixSource("openai/gsm8k", "main", "train[:10%]", None)),
    ],
)  # fmt: skip
def test_entries_name_source_configuration_split_and_rows(entry, source):
    assert parse_entry(entry) == source
    assert recipe.mix_sources({"mix": [entry]})[0][1:] == (
        {"mix": [entry], "path": source.path, "name": source.config},
        source.split,
        source.rows,
    )  # the recipe reads the same in every run


@pytest.mark.parametrize(
    "value, words",
    [
        ("/data/a.jsonl#2k", "is not SOURCE[@CONFIG][:SPLIT][#ROWS]"),
        ("/data/a.jsonl#0", "#ROWS must be 1 to 100,000,000"),
        ("/data/a.jsonl, /data/a.jsonl:train#5", "item 2: the same rows as item 1: give one entry more rows"),
    ],
)
def test_bad_entries_are_refused_with_why(value, words):
    with pytest.raises(SpecError) as caught:
        resolve_spec("demo", [f"dataset.mix={value}"])
    assert "dataset.mix" in str(caught.value) and words in str(caught.value)


def test_the_forms_line_reads_as_entries_and_back():
    spec = resolve_spec("demo", ["dataset.mix=/data/a.jsonl#20, org/set:train_sft"])
    assert spec.dataset.mix == ["/data/a.jsonl#20", "org/set:train_sft"]
    field = FIELDS_BY_PATH["dataset.mix"]
    assert field.from_form(field.to_form(spec.dataset.mix)) == "/data/a.jsonl#20, org/set:train_sft"


def test_each_mixed_in_file_is_checked_before_launch_like_the_main_one(tmp_path, demo_home):
    (tmp_path / "other.jsonl").write_text(json.dumps({"question": "1 + 1", "reply": "2"}) + "\n")
    missing = tmp_path / "missing.jsonl"
    spec = resolve_spec("demo", [f"dataset.mix={tmp_path / 'other.jsonl'}#10, {missing}"])
    found = {(p.field, p.message) for p in preflight(spec, tmp_path / "runs")}
    other = f"{tmp_path / 'other.jsonl'}#10"
    assert (
        "dataset.mix",
        f"{other!r}: {tmp_path / 'other.jsonl'} line 1 has no column 'prompt' (it has 'question', "
        "'reply'): set dataset.prompt_field to the column that holds the prompt, or change dataset.format",
    ) in found
    assert any(f == "dataset.mix" and str(missing) in m and "does not exist" in m for f, m in found), found
    fine = resolve_spec("demo", [f"dataset.mix={demo_home / 'formats' / 'prompt-completion.jsonl'}"])
    assert not [p for p in preflight(fine, tmp_path / "runs") if p.field == "dataset.mix"]


def test_a_mixed_in_file_in_another_format_is_checked_in_its_own(tmp_path, demo_home):
    """A chat job may mix in alpaca rows (converted at run time): the file is checked as alpaca, not as chats; a
    preference file names no SFT format, so it is checked as the job's format; chats cannot join a prompt-completion
    job, and the problem says which formats can."""
    formats = demo_home / "formats"
    chat = [f"dataset.path={formats / 'messages.jsonl'}", "dataset.format=messages"]
    fine = resolve_spec("demo", [*chat, f"dataset.mix={formats / 'alpaca.jsonl'}#50"])
    assert not [p for p in preflight(fine, tmp_path / "runs") if p.field == "dataset.mix"]
    (tmp_path / "broken.jsonl").write_text(json.dumps({"instruction": "Add.", "output": 2}) + "\n")
    broken = resolve_spec("demo", [*chat, f"dataset.mix={tmp_path / 'broken.jsonl'}"])
    (problem,) = [p.message for p in preflight(broken, tmp_path / "runs") if p.field == "dataset.mix"]
    assert "column 'output' holds a number, but dataset.format alpaca needs" in problem, problem
    pairs = resolve_spec("demo", [f"dataset.mix={formats / 'preference.jsonl'}"])
    (problem,) = [p.message for p in preflight(pairs, tmp_path / "runs") if p.field == "dataset.mix"]
    assert "has no column 'completion'" in problem, problem
    chats = resolve_spec("demo", [f"dataset.mix={formats / 'messages.jsonl'}"])  # into a prompt-completion job
    (problem,) = [p.message for p in preflight(chats, tmp_path / "runs") if p.field == "dataset.mix"]
    assert problem.endswith(
        "messages.jsonl': its columns (messages) are the messages format's, and messages rows cannot join a "
        "prompt-completion job; mix in rows of these formats: prompt-completion, alpaca"
    ), problem


def test_the_estimate_counts_the_mixed_in_rows(demo_home):
    extra = demo_home / "formats" / "prompt-completion.jsonl"
    lines = len(extra.read_text().splitlines())
    alone, _ = dataset_rows(resolve_spec("demo"))
    rows, source = dataset_rows(resolve_spec("demo", [f"dataset.mix={extra}#300, {extra}:train[:50%]"]))
    assert rows == alone + 300 + lines  # a split slice is counted whole: the file's rows are all that is known
    assert (
        source
        == f" in train.jsonl + 300 mixed in from prompt-completion.jsonl + {lines:,} mixed in from prompt-completion.jsonl"
    )
    assert dataset_rows(resolve_spec("demo", ["dataset.mix=org/unknown-on-the-hub"])) == (None, "")


def test_the_preview_names_what_it_does_not_measure(demo_home):
    from tunedeck.app.dataset_preview import preview_markdown
    from tunedeck.backend.data.preview import preview

    extra = f"{demo_home / 'formats' / 'prompt-completion.jsonl'}#300"
    result = preview(resolve_spec("demo", [f"dataset.mix={extra}"]), limit=50)
    assert result["mixed"] == [extra] and result["rows_in_split"] == 2000  # the rows measured: dataset.path's
    assert f"mixed in too, not measured here: `{extra}`" in preview_markdown(result)
    assert "mixed in" not in preview_markdown(preview(resolve_spec("demo"), limit=50))
