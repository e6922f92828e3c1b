"""Examples from a run's data for the Try box: typed so the run's template gives back the trained prompt."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend import recipe
from tunedeck.backend.after.examples import NoExamples, data_examples, pick, verdict
from tunedeck.backend.after.prompting import answer_line, chat_messages, resolve_template, transcript, wrap_plain
from tunedeck.backend.after.scoring import rouge_l
from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.spec import JobSpec, parse_spec


def _write(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _job(path, fmt: str, **fields) -> JobSpec:
    return parse_spec({"dataset": {"path": str(path), "format": fmt, "max_seq_length": 64, **fields}})


def test_an_alpaca_example_wrapped_by_the_try_box_is_the_prompt_the_run_trained_on(tmp_path):
    rows = [
        {"instruction": "Name a colour.", "input": "", "output": "Red"},
        {"instruction": "Translate to French.", "input": "good morning", "output": "bonjour"},
    ]
    _write(tmp_path / "data" / "train.jsonl", rows)
    job = _job(tmp_path / "data" / "train.jsonl", "alpaca")
    dataset = job.dataset.model_dump(mode="json")  # as the recipe reads job.yaml
    trained = recipe.to_trl_format(recipe.load_split(dataset, "train"), dataset, "text")
    pairs, _, _ = data_examples(tmp_path, job)
    template = resolve_template("auto", "alpaca", has_chat_template=False)
    for number, row in enumerate(trained, start=1):
        example = pick(pairs, "train.jsonl", False, number)
        assert wrap_plain(template, example.prompt) == row["prompt"]  # exactly, the input's section included
        assert example.expected == row["completion"]
    assert pick(pairs, "train.jsonl", False, 1).prompt == "Name a colour."


def test_held_out_rows_come_first_and_training_rows_say_the_model_saw_them(tmp_path):
    qa = [{"prompt": f"Q: {i} + 1\nA:", "completion": f" {i + 1}"} for i in range(5)]
    _write(tmp_path / "data" / "train.jsonl", qa)
    job = _job(tmp_path / "data" / "train.jsonl", "prompt-completion")
    pairs, source, held_out = data_examples(tmp_path, job)
    assert not held_out and len(pairs) == 5
    seen = pick(pairs, source, held_out, 2)
    assert (seen.prompt, seen.expected) == ("Q: 1 + 1\nA:", " 2")
    assert seen.describe() == "example 2 of 5, a training row (the model has seen it) of train.jsonl"

    _write(tmp_path / "data" / "eval.jsonl", qa[:3])  # beside it, as datasets names a split
    pairs, source, held_out = data_examples(tmp_path, job)
    assert held_out and len(pairs) == 3 and source.endswith("eval.jsonl")
    assert pick(pairs, source, held_out, 3).describe() == "example 3 of 3, a held-out row of eval.jsonl"
    assert pick(pairs, source, held_out).number in (1, 2, 3)  # at random without a number
    with pytest.raises(NoExamples, match="example: 4 is not between 1 and 3"):
        pick(pairs, source, held_out, 4)


def test_a_conversation_is_tried_with_its_last_user_message(tmp_path):
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    tool_call = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "sunny"},
        {"role": "user", "content": "So?"},
        {"role": "assistant", "content": "Sunny."},
    ]
    _write(tmp_path / "data" / "train.jsonl", [{"messages": m} for m in (chat, tool_call, chat[1:])])
    pairs, source, held_out = data_examples(tmp_path, _job(tmp_path / "data" / "train.jsonl", "messages"))
    example = pick(pairs, source, held_out, 1)
    assert (example.prompt, example.expected, example.system) == ("Capital of France?", "Paris.", "Be brief.")
    assert (example.turns, example.left_out) == ((("Hi", "Hello."),), 0)
    assert example.describe().endswith("of train.jsonl · with its system message and 1 earlier turn")
    assert chat_messages(example.prompt, example.turns, example.system) == chat[:-1]  # the row's prompt, exactly

    tool = pick(pairs, source, held_out, 2)  # a tool's turn is not a user and assistant turn: not sent, said so
    assert (tool.prompt, tool.system, tool.turns, tool.left_out) == ("So?", "", (), 3)
    assert tool.describe().endswith("of train.jsonl · its 3 earlier messages not sent")
    bare = pick(pairs, source, held_out, 3)
    assert (bare.system, bare.turns) == ("", (("Hi", "Hello."),))
    assert chat_messages(bare.prompt, bare.turns, bare.system) == chat[1:-1]


def test_plain_text_data_has_no_example_and_says_what_to_do(tmp_path):
    _write(tmp_path / "data" / "train.jsonl", [{"text": "Once upon a time"}])
    with pytest.raises(NoExamples, match=r"is plain text, with no prompt and answer to take: type a prompt"):
        data_examples(tmp_path, _job(tmp_path / "data" / "train.jsonl", "text"))
    assert issubclass(NoExamples, AfterError)  # shown as a message by the page and the CLI


def test_an_answer_is_judged_as_evaluation_scores_it():
    assert verdict(" 7", " 7\n") == "✓ the data's answer"
    assert verdict("It is 7.", " 7") == "✓ contains the data's answer (ROUGE-L 0.50)"  # 1 of 3 words, all of 1
    assert verdict(" 12", " 7") == "✗ not the data's answer (ROUGE-L 0.00)"
    assert verdict("Paris is the capital", "The capital is Paris") == "✗ not the data's answer (ROUGE-L 0.50)"
    assert verdict("", "") == "✓ the data's answer"


def test_an_answer_line_says_how_long_and_why_it_ended():
    done = {"text": " 7", "new_tokens": 3, "seconds": 0.25, "stop_reason": "end"}
    assert answer_line(done) == "3 tokens in 0.25 s, 12 tokens/s · ended at its end-of-sequence token"
    cut = {"text": "blah", "new_tokens": 64, "seconds": 2.0, "stop_reason": "max_new_tokens"}
    assert answer_line(cut) == "64 tokens in 2.00 s, 32 tokens/s · cut at max new tokens"
    empty = {"text": "", "new_tokens": 1, "seconds": 0.01, "stop_reason": "end"}
    assert answer_line(empty) == "an empty answer: it ended at its end-of-sequence token at once (1 token)"
    stopped = {"text": "  ", "new_tokens": 2, "seconds": 0.01, "stop_reason": "stop string"}
    assert answer_line(stopped).startswith("an empty answer: it ended at a stop string at once")


def test_a_conversation_shows_its_turns_then_the_new_prompt():
    assert transcript([], "Hi") == "> Hi\n"
    assert transcript([("Hi", "Hello.")]) == "> Hi\nHello.\n\n"  # the earlier turns alone, before a prompt
    assert (
        transcript([("Hi", "Hello."), ("2 + 2?", "4")], "And 3 + 3?") == "> Hi\nHello.\n\n> 2 + 2?\n4\n\n> And 3 + 3?\n"
    )
    done = {"text": " 7", "new_tokens": 3, "seconds": 0.25, "stop_reason": "end", "prompt_tokens": 57}
    assert answer_line(done).endswith("· ended at its end-of-sequence token · the prompt 57 tokens")


def test_rouge_l_is_rouge_scores_own_on_english_and_counts_cjk_characters_as_words():
    from rouge_score import rouge_scorer

    theirs = rouge_scorer.RougeScorer(["rougeL"])  # the reference implementation, its own tokenizer
    for answer, expected in [
        ("The cat sat on the mat.", "the cat is on the mat"),
        ("It's 7, I think", "7"),
        ("completely different", "nothing shared here"),
    ]:
        assert rouge_l(answer, expected) == pytest.approx(theirs.score(expected, answer)["rougeL"].fmeasure)
    assert theirs.score("猫坐在垫子上", "猫在垫子上")["rougeL"].fmeasure == 0  # why we split CJK ourselves
    assert rouge_l("猫在垫子上", "猫坐在垫子上") == pytest.approx(2 * 5 / (5 + 6))  # 5 of 5 and 5 of 6 characters
    assert rouge_l("", "7") == 0.0 and rouge_l("7", "7") == 1.0
