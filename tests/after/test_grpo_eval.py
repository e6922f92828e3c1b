"""Evaluating a GRPO run: its prompts (prompt-only) are answered and scored against their reference answers.

A real GRPO run evaluated on the demo's held-out prompts is in tests/runs/test_grpo.py (beside its learning test).
"""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.after import scoring
from tunedeck.backend.spec import parse_spec


def test_prompt_only_rows_are_scored_against_their_answer_column_under_any_column_names(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"q": "Q: 2 + 2\nA:", "ref": "4"}, {"q": "Q: reverse a b\nA:", "ref": "b a"}, {"q": "Q: anything\nA:"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = {"path": str(path), "format": "prompt-only", "prompt_field": "q", "answer_field": "ref"}
    read = scoring._read_rows(cfg, "train", str(path), None, answers_optional=True)
    assert read == [
        {"prompt": "Q: 2 + 2\nA:", "completion": "4"},
        {"prompt": "Q: reverse a b\nA:", "completion": "b a"},
        {"prompt": "Q: anything\nA:", "completion": None},  # answered, not scored
    ]
    assert [scoring.has_answer(row) for row in read] == [True, True, False]
    assert scoring.question_and_answer(read[0]) == ("Q: 2 + 2\nA:", "4")
    # A file of prompts without any answer column: every prompt is answered and none is scored.
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "Q: hi\nA:"}) + "\n")
    read = scoring._read_rows({"path": str(bare), "format": "prompt-only"}, "train", str(bare), None, True)
    assert read == [{"prompt": "Q: hi\nA:", "completion": None}]


def test_a_folder_of_split_files_is_evaluated_on_its_held_out_file(tmp_path):
    """The GRPO demo trains on a folder (train.jsonl, validation.jsonl) and has no dataset.eval_split: its held-out
    prompts are the validation file's, as datasets splits the folder."""
    folder = tmp_path / "prompts"
    folder.mkdir()
    for split, answer in (("train", "1"), ("validation", "2")):
        (folder / f"{split}.jsonl").write_text(json.dumps({"prompt": f"Q: {split}\nA:", "answer": answer}) + "\n")
    job = parse_spec({"dataset": {"path": str(folder), "format": "prompt-only", "split": "train", "eval_split": None}})
    rows, source = scoring.eval_rows(tmp_path, job)
    assert source == str(folder / "validation.jsonl")
    assert rows == [{"prompt": "Q: validation\nA:", "completion": "2"}]
    assert scoring.training_rows(tmp_path, job)[0] == [{"prompt": "Q: train\nA:", "completion": "1"}]


@pytest.mark.parametrize(
    "answer, expected, same",
    [(" 7 ", "7", True), ("3 + 4 = 7 #### 7", "7", True), ("\\boxed{1,200}", "1200", True), (" 8", "7", False)],
)
def test_an_exact_match_is_the_same_final_answer_as_grpos_reward_scores_it(answer, expected, same):
    from tunedeck.backend.after.scoring import exact_match

    assert exact_match(answer, expected) is same
