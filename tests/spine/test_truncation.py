"""Rows cut at max_seq_length are a problem: the warning says how many of the rows measured are cut, what of them
is lost (the assistant's turn, whole or in part) and the max_seq_length that keeps 95% of them whole, and its Fix
clears it; the page's preview follows max_seq_length without measuring again; `tunedeck preview` and `tunedeck
validate` print the same warning. Measured with the demo's own tokenizer and chat template, in this process."""

from __future__ import annotations

import json

import pytest

from tunedeck.app.dataset_preview import MEASURING, preview_text
from tunedeck.app.form_marks import fix_choices
from tunedeck.app.job_outputs import evaluate, issues_markdown
from tunedeck.backend.cli import main
from tunedeck.backend.data.preview import preview
from tunedeck.backend.data.truncation import measure_key
from tunedeck.backend.spec import resolve_spec, set_paths
from tunedeck.backend.spec.fields import values_from_spec

FIELD = "dataset.max_seq_length"


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


@pytest.fixture(scope="module")
def chat_file(demo_home, tmp_path_factory):
    """30 chats: 10 of the demo's (about 18 tokens), 14 whose answers run past 64 tokens and 6 whose questions do,
    each of its own length (so one more row cut is a step from 5% to over)."""
    demo = [json.loads(line) for line in (demo_home / "formats" / "messages.jsonl").read_text().splitlines()[:10]]
    long_answers = [chat("Add the numbers. 5 + 9", " ".join(["14"] * (25 + 2 * i))) for i in range(14)]
    long_questions = [chat("Add the numbers. " + " + ".join(["5"] * (40 + 2 * i)), "5") for i in range(6)]
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in demo + long_answers + long_questions))
    return path


@pytest.fixture(scope="module")
def chat_job(chat_file):
    return resolve_spec("demo", [f"dataset.path={chat_file}", "dataset.format=messages"])  # max_seq_length 64


@pytest.fixture(scope="module")
def measured(chat_job) -> dict:
    """What the page holds after the preview measured the chat file: {measure_key: measurement}."""
    return {measure_key(chat_job): preview(chat_job, rows=3)}


def cut_warnings(spec, measured) -> list:
    return [p for p in evaluate(values_from_spec(spec), measured=measured).issues if p.field == FIELD]


def test_cut_assistant_turns_are_a_warning_naming_the_answer_and_the_length_that_keeps_p95(chat_job, measured):
    result = evaluate(values_from_spec(chat_job), measured=measured)
    (cut,) = [p for p in result.issues if p.field == FIELD]
    assert cut.level == "warning"
    assert cut.message.startswith("20 of 30 rows measured (67%) are longer than max_seq_length (64 tokens)")
    assert (
        "the assistant's turn, the answer the model learns to give, is cut away whole in 6 rows (they train on "
        "the question alone) and cut short in 14." in cut.message
    )
    assert "Packing does not save them: each row is cut at max_seq_length before it is packed." in cut.message
    lengths = sorted(measured[measure_key(chat_job)]["lengths"])
    p95 = lengths[28]  # nearest rank: the 29th of 30
    longer = cut.fix[FIELD]
    assert longer % 8 == 0 and p95 <= longer < p95 + 8
    assert f"Set it to {longer} to keep 95% of rows whole (p95: {p95} tokens)." in cut.message
    assert ("Fix: dataset.max_seq_length=" + str(longer), {FIELD: longer}) in fix_choices(result.issues)
    assert "[**Max sequence length**]" in issues_markdown(result) and "20 of 30 rows measured" in issues_markdown(
        result
    )


def test_its_fix_clears_the_warning(chat_job, measured):
    (cut,) = cut_warnings(chat_job, measured)
    fixed = set_paths(chat_job, cut.fix)
    assert measure_key(fixed) == measure_key(chat_job)  # the same measurement, read for the new length
    assert cut_warnings(fixed, measured) == []


def test_five_percent_cut_shows_nothing_and_one_row_more_is_a_warning(chat_job, measured):
    lengths = sorted(measured[measure_key(chat_job)]["lengths"])
    assert cut_warnings(set_paths(chat_job, {FIELD: lengths[28]}), measured) == []  # 1 of 30 cut: 3%
    (over,) = cut_warnings(set_paths(chat_job, {FIELD: lengths[27]}), measured)  # 2 of 30: 7%
    assert over.message.startswith(f"2 of 30 rows measured (7%) are longer than max_seq_length ({lengths[27]} tokens)")
    demo = resolve_spec("demo")  # the demo's rows all fit 64 tokens
    assert cut_warnings(demo, {measure_key(demo): preview(demo, rows=0, limit=200)}) == []


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"dataset.packing": False}, "cut away whole in 6 rows (they train on the question alone) and"),
        (
            {"dataset.packing": False, "dataset.assistant_only_loss": True},
            "the assistant's turn, the only part the loss is computed on, is cut away whole in 6 rows (TRL leaves "
            "them out of training)",
        ),
        (
            {"dataset.packing": True, "dataset.assistant_only_loss": True},
            "is cut away whole in 6 rows (packed with nothing to learn from) and cut short in 14. Packing does not",
        ),
    ],
)
def test_what_a_cut_costs_follows_packing_and_the_loss(chat_job, measured, changes, said):
    (cut,) = cut_warnings(set_paths(chat_job, changes), measured)
    assert said in cut.message
    assert ("Packing does not save them" in cut.message) is changes["dataset.packing"]


def test_the_preview_follows_max_seq_length_and_measures_only_when_the_data_or_tokenizer_change(
    chat_job, measured, demo_home
):
    text, wanted = preview_text(chat_job, measured)
    assert wanted is None  # measured already
    assert "| max_seq_length | 64 (20 rows truncated: the answer cut away whole in 6, cut short in 14) |" in text
    assert "Row 1 as the model sees it:" in text and "<|assistant|>" in text
    text, wanted = preview_text(set_paths(chat_job, {FIELD: 128}), measured)
    assert wanted is None and "| max_seq_length | 128 (" in text and "| max_seq_length | 64 " not in text
    assert preview_text(set_paths(chat_job, {"training.learning_rate": 1e-3}), measured)[1] is None
    other = set_paths(chat_job, {"dataset.path": str(demo_home / "formats" / "messages.jsonl")})
    assert preview_text(other, measured) == (MEASURING, measure_key(other))
    assert measure_key(set_paths(chat_job, {"model.name_or_path": str(demo_home / "model-sft")})) != measure_key(
        chat_job
    )
    missing = set_paths(chat_job, {"dataset.path": str(demo_home / "nowhere.jsonl")})
    text, wanted = preview_text(missing, measured)
    assert wanted is None and "does not exist here" in text  # nothing to measure: it would only fail


def test_an_edited_data_file_is_a_new_measurement(tmp_path, chat_job, chat_file):
    copy = tmp_path / "chats.jsonl"
    copy.write_bytes(chat_file.read_bytes())
    spec = set_paths(chat_job, {"dataset.path": str(copy)})
    before = measure_key(spec)
    copy.write_text(copy.read_text() + copy.read_text().splitlines()[0] + "\n")
    assert measure_key(spec) != before


def test_tunedeck_preview_and_validate_print_the_same_warning(chat_file, capsys):
    job = ["demo", "--set", f"dataset.path={chat_file}", "--set", "dataset.format=messages"]
    assert main(["preview", *job, "--rows", "0"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: dataset.max_seq")]
    assert len(said) == 1 and "20 of 30 rows measured" in said[0] and said[0].endswith(")")
    assert "the assistant's turn" in said[0] and "(--set dataset.max_seq_length=" in said[0]
    assert main(["validate", *job]) == 0
    out = capsys.readouterr()
    assert [line for line in out.err.splitlines() if line.startswith("warning: dataset.max_seq")] == said
    assert "(1 warnings)" in out.out
    assert main(["preview", *job, "--rows", "0", "--json"]) == 0
    (problem,) = json.loads(capsys.readouterr().out)["problems"]
    assert problem["field"] == FIELD and problem["fix"][FIELD] % 8 == 0
