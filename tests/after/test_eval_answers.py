"""Every answer of an evaluation, kept per model beside eval.json and shown side by side (no model needed)."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.after.eval_answers import answers_jsonl, answers_path, answers_table, newest_answers
from tunedeck.backend.after.eval_results import read_eval, save_results
from tunedeck.backend.after.scoring import judged


def _answers(expected_and_answers, prompt=lambda i: f"Q: {i} + 1\nA:") -> list[dict]:
    return [judged(prompt(i), expected, answer) for i, (expected, answer) in enumerate(expected_and_answers)]


def _evaluated(run_dir, at: float, **models) -> dict:
    results = {
        name: {"loss": 1.0, "generated": len(rows), "evaluated_at": at, "answers": rows}
        for name, rows in models.items()
    }
    return save_results(run_dir, results)


def test_each_models_answers_go_beside_eval_json_not_into_it(tmp_path):
    base = _answers([(" 1", " 7"), (" 2", " 2")])
    data = _evaluated(tmp_path, 1.0, base=base, final=_answers([(" 1", " 1"), (" 2", " 12")]))
    assert "answers" not in data["results"]["base"] and "answers" not in json.loads(
        (tmp_path / "eval.json").read_text()
    )
    assert data["results"]["base"]["answers_file"] == str(answers_path(tmp_path, "base"))
    lines = answers_path(tmp_path, "base").read_text().splitlines()
    assert [json.loads(line) for line in lines] == base
    assert list(newest_answers(tmp_path, read_eval(tmp_path))) == ["base", "final"]

    # Evaluated again on data without answers to generate: the old file would not match, it goes.
    _evaluated(tmp_path, 2.0, base=[])
    assert not answers_path(tmp_path, "base").exists()


def test_the_table_shows_the_newest_evaluation_side_by_side_and_filters_it(tmp_path):
    _evaluated(tmp_path, 1.0, **{"checkpoint-30": _answers([(" 1", " 9")] * 3)})  # an older evaluation
    final = _answers([(" 1", " 1"), (" 2", " 12"), (" 3", " 4")])
    _evaluated(tmp_path, 2.0, base=_answers([(" 1", " 5"), (" 2", " 12"), (" 3", " 4")]), final=final)
    answers = newest_answers(tmp_path, read_eval(tmp_path))
    assert list(answers) == ["base", "final"]  # checkpoint-30 answered in another evaluation: not beside these

    headers, rows, line = answers_table(answers)
    assert headers == ["#", "prompt", "the data's answer", "base", "final"]
    assert rows[0] == [1, "Q: 0 + 1\nA:", "1", "✗ 0.00 · 5", "✓ 1.00 · 1"]
    assert rows[1][3:] == ["≈ 0.00 · 12", "≈ 0.00 · 12"]  # contains the data's answer ("12" is not the word "2")
    assert line == (
        "3 examples · the data's answer exactly (✓): base 0, final 1 · ≈ contains it · ✗ neither · then ROUGE-L"
    )

    _, wrong, line = answers_table(answers, "wrong")
    assert [r[0] for r in wrong] == [2, 3] and line.startswith("2 of 3 examples where the last model is not exactly")
    _, differ, _ = answers_table(answers, "differ")
    assert [r[0] for r in differ] == [1]
    with pytest.raises(ValueError, match="show: 'some' is not one of all, wrong, differ"):
        answers_table(answers, "some")
    assert answers_table({}) == (["#", "prompt", "the data's answer"], [], "Evaluate to see each model's answers here.")


def test_a_file_that_does_not_match_its_evaluation_is_left_out(tmp_path):
    _evaluated(tmp_path, 1.0, base=_answers([(" 1", " 1")] * 4), final=_answers([(" 1", " 1")] * 4))
    answers_path(tmp_path, "base").write_text(answers_path(tmp_path, "base").read_text().split("\n", 1)[1])
    answers_path(tmp_path, "final").write_text("{not json\n")
    assert newest_answers(tmp_path, read_eval(tmp_path)) == {}


def test_prompts_show_as_the_try_box_takes_them_and_the_download_keeps_them_whole(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    alpaca = "### Instruction:\nName a colour.\n\n### Response:\n"
    prompts = [chat, alpaca]
    answers = {"final": _answers([("4", "4"), ("Red", "Blue")], prompt=prompts.__getitem__)}
    _, rows, _ = answers_table(answers)
    assert [r[1] for r in rows] == ["2 + 2?", "Name a colour."]
    lines = [json.loads(line) for line in answers_jsonl(answers).splitlines()]
    assert lines[0] == {
        "prompt": chat,
        "expected": "4",
        "answers": {"final": "4"},
        "exact_match": {"final": True},
        "contains_match": {"final": True},
        "rouge_l": {"final": 1.0},
    }
    assert lines[1]["prompt"] == alpaca


def test_prompts_without_the_datas_answer_show_each_models_answer_unjudged(tmp_path):
    _evaluated(tmp_path, 1.0, base=_answers([(None, " 7"), (None, " 5")]), final=_answers([(None, " 3"), (None, " 4")]))
    answers = newest_answers(tmp_path, read_eval(tmp_path))
    _, rows, line = answers_table(answers)
    assert rows == [[1, "Q: 0 + 1\nA:", "—", "7", "3"], [2, "Q: 1 + 1\nA:", "—", "5", "4"]]  # no ✓ ≈ ✗, no ROUGE-L
    assert line == "2 examples · prompts without answers in the data: each model's answer"
    assert answers_table(answers, "wrong")[1] == []  # nothing to be wrong against
    download = [json.loads(line) for line in answers_jsonl(answers).splitlines()]
    assert download[0] == {
        "prompt": "Q: 0 + 1\nA:",
        "expected": None,
        "answers": {"base": " 7", "final": " 3"},
        "exact_match": {"base": None, "final": None},
        "contains_match": {"base": None, "final": None},
        "rouge_l": {"base": None, "final": None},
    }

    # Some rows with the data's answer, some without: the marks and counts are of those with one.
    _evaluated(tmp_path, 2.0, final=_answers([(" 1", " 1"), (None, " 4"), (" 3", " 8")]))
    _, rows, line = answers_table(newest_answers(tmp_path, read_eval(tmp_path)))
    assert [r[2:] for r in rows] == [["1", "✓ 1.00 · 1"], ["—", "4"], ["3", "✗ 0.00 · 8"]]
    assert line.startswith("3 examples · the data's answer exactly (✓) of the 2 with one: final 1 · ")
