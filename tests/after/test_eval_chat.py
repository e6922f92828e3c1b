"""`tunedeck eval` and `tunedeck chat` on a real demo run (60 steps of LoRA, DDP on 2 CPU processes)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tunedeck.backend.after.eval_results import read_eval
from tunedeck.backend.after.examples import verdict

from .helpers import CHAT_SYSTEM, tunedeck

pytestmark = pytest.mark.integration


def test_eval_adapter_beats_the_base_and_is_saved(demo_run, demo_home):
    runs_dir, run_id = demo_run
    result = tunedeck("eval", run_id, "--all", "--json", "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    base, adapter = report["base"], report["adapter"]
    # Measured on the demo's held-out file, found beside its training file as datasets splits a folder.
    assert report["data"] == str(demo_home / "data" / "eval.jsonl")
    assert adapter["name"] == "final" and base["examples"] == adapter["examples"] == 200
    assert adapter["loss"] < base["loss"]
    assert adapter["exact_match"] > base["exact_match"]
    assert adapter["perplexity"] == pytest.approx(math.exp(adapter["loss"]))
    assert sorted(report["checkpoints"]) == ["checkpoint-30", "checkpoint-60"]
    # Read again from the run folder, as the panel does when the run is reopened.
    saved = read_eval(runs_dir / run_id)["results"]
    assert set(saved) == {"base", "checkpoint-30", "checkpoint-60", "final"}
    assert saved["final"]["loss"] == adapter["loss"] and saved["checkpoint-30"]["step"] == 30
    # Every answer of each model, row by row of the data, beside eval.json (not in it).
    assert "answers" not in saved["final"]
    assert saved["final"]["answers_file"] == str(runs_dir / run_id / "eval-answers" / "final.jsonl")
    answers = [json.loads(line) for line in Path(saved["final"]["answers_file"]).read_text().splitlines()]
    rows = [json.loads(line) for line in (demo_home / "data" / "eval.jsonl").read_text().splitlines()]
    assert [(a["prompt"], a["expected"]) for a in answers] == [(r["prompt"], r["completion"]) for r in rows]
    assert sum(a["exact_match"] for a in answers) / len(rows) == pytest.approx(adapter["exact_match"])


def test_eval_table_for_one_checkpoint_keeps_earlier_results(demo_run):
    runs_dir, run_id = demo_run
    before = read_eval(runs_dir / run_id)["results"]
    result = tunedeck("eval", run_id, "--checkpoint", "30", "--limit", "16", "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["MODEL", "LOSS", "PERPLEXITY", "EXACT", "CONTAINS", "ROUGE-L", "EXAMPLES"]
    assert [line.split()[0] for line in lines[2:4]] == ["base", "checkpoint-30"]
    assert lines[-2] == f"saved in {runs_dir / run_id / 'eval.json'}"
    assert lines[-1] == f"every answer, one file per model: {runs_dir / run_id / 'eval-answers'}/<model>.jsonl"
    saved = read_eval(runs_dir / run_id)["results"]
    assert saved["checkpoint-30"]["examples"] == 16  # replaced by this evaluation
    assert set(saved) == set(before) | {"base", "checkpoint-30"}
    assert all(saved[name] == before[name] for name in set(before) - {"base", "checkpoint-30"})  # the others kept


def test_chat_answers_with_the_adapter_and_with_the_base(demo_run):
    runs_dir, run_id = demo_run
    prompt = "Q: Add the numbers. 3 + 4\nA:"
    tuned = tunedeck("chat", run_id, "--prompt", prompt, "--max-new-tokens", "6", "--runs-dir", runs_dir)
    assert tuned.returncode == 0, tuned.stderr
    assert "loading the final adapter" in tuned.stderr
    answer = tuned.stdout.strip()
    assert answer and answer[0].isdigit()  # the fine-tuned model answers in the trained format: " 7"
    assert re.search(
        r"^\(\d+ tokens? in [\d.]+ s.* · ended at its end-of-sequence token · the prompt \d+ tokens\)$",
        tuned.stderr,
        re.M,
    )
    # Interactive, with the base alone: prompts from stdin until end of input.
    base = tunedeck(
        "chat",
        run_id,
        "--base",
        "--max-new-tokens",
        "6",
        "--runs-dir",
        runs_dir,
        input=prompt.replace("\n", "\\n") + "\n/exit\n",
    )
    assert base.returncode == 0, base.stderr
    assert "the base model alone" in base.stderr
    assert base.stdout.strip() != answer


def test_chat_asks_an_example_of_the_held_out_data_and_judges_the_answer(demo_run, demo_home):
    runs_dir, run_id = demo_run
    row = json.loads((demo_home / "data" / "eval.jsonl").read_text().splitlines()[4])
    result = tunedeck("chat", run_id, "--example", "5", "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    assert f"example 5 of 200, a held-out row of eval.jsonl:\n{row['prompt']}\n" in result.stderr
    answer = result.stdout.rstrip("\n")
    judged = verdict(answer, row["completion"])  # unit-tested in test_examples.py
    assert result.stderr.rstrip().endswith(f"the data's answer: {row['completion']}\n{judged}".rstrip())
    both = tunedeck("chat", run_id, "--example", "--prompt", "hi", "--runs-dir", runs_dir, timeout=60)
    assert (both.returncode, both.stderr.strip()) == (2, "error: --example: give --prompt or --example, not both")
    system = tunedeck("chat", run_id, "--prompt", "hi", "--system", "Be brief.", "--runs-dir", runs_dir, timeout=60)
    assert system.returncode == 2 and "loading" not in system.stderr  # said before the model loads
    assert system.stderr.startswith("error: --system: the prompt-completion data's prompts are not wrapped in a chat")


def test_chat_sends_a_conversations_system_message_and_earlier_turns(chat_run):
    runs_dir, run_id = chat_run

    def prompt_tokens(*args) -> tuple[int, str]:
        result = tunedeck("chat", run_id, *args, "--max-new-tokens", "2", "--runs-dir", runs_dir)
        assert result.returncode == 0, result.stderr
        return int(re.search(r"the prompt (\d+) tokens", result.stderr).group(1)), result.stderr

    framed, shown = prompt_tokens("--example", "2")
    assert (
        "example 2 of 400, a training row (the model has seen it) of conversations.jsonl · with its system message "
        f"and 1 earlier turn:\nsystem: {CHAT_SYSTEM}\n> Subtract the numbers. 1 - 0\n1\n\n> Add the numbers. 9 + 0\n"
    ) in shown
    alone, _ = prompt_tokens("--prompt", "Add the numbers. 9 + 0")
    with_system, _ = prompt_tokens("--prompt", "Add the numbers. 9 + 0", "--system", CHAT_SYSTEM)
    assert alone < with_system < framed  # the system message, then the earlier turn too, reached the model


def test_a_checkpoint_that_does_not_exist_is_named_before_anything_loads(demo_run):
    runs_dir, run_id = demo_run
    for command in (["chat", "--prompt", "hi"], ["eval"], ["merge", "-o", "unused"]):
        result = tunedeck(command[0], run_id, *command[1:], "--checkpoint", "45", "--runs-dir", runs_dir, timeout=60)
        assert result.returncode == 2
        assert (
            result.stderr.strip() == f"error: --checkpoint: run {run_id} has no checkpoint 45 (its checkpoints: 30, 60)"
        )


def test_the_demo_keeps_the_readmes_promise(demo_run):
    # README: "a real 2-process DDP run ... its loss falls from about 8 to under 2 in its first 60 steps" (the
    # preset's 600 steps, about a minute, to about 1: measured, not trained here, where 60 steps keep the suite fast).
    runs_dir, run_id = demo_run
    records = [json.loads(line) for line in (runs_dir / run_id / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r["event"] == "start")
    losses = [r["loss"] for r in records if r["event"] == "log" and "loss" in r]
    assert start["world_size"] == 2 and start["model_class"] == "DistributedDataParallel"
    assert len(losses) == 60 and losses[0] > 7 and losses[-1] < 2


def test_a_qlora_run_is_evaluated_on_its_4bit_base(qlora_run):
    runs_dir, run_id = qlora_run
    result = tunedeck("eval", run_id, "--limit", "16", "--json", "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["adapter"]["loaded_as"] == "4-bit nf4 (21 Linear4bit layers)"  # as it trained: 3 layers x 7 linears
    assert report["adapter"]["loss"] < report["base"]["loss"]


@pytest.fixture
def eval_kept(demo_run):
    """The demo run's eval.json and answers, put back after the test (other tests read them)."""
    run_dir = demo_run[0] / demo_run[1]
    kept = {p: p.read_bytes() for p in [run_dir / "eval.json", *run_dir.glob("eval-answers/*.jsonl")] if p.exists()}
    yield run_dir
    for path in run_dir.glob("eval-answers/*.jsonl"):
        path.unlink()
    for path, content in kept.items():
        path.write_bytes(content)


def test_prompts_without_answers_are_answered_and_not_scored(demo_run, demo_home, eval_kept, tmp_path):
    runs_dir, run_id = demo_run
    rows = [json.loads(line) for line in (demo_home / "data" / "eval.jsonl").read_text().splitlines()[:6]]
    prompts = tmp_path / "prompts.jsonl"  # no completion column at all: what a user has to get predictions for
    prompts.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    result = tunedeck("eval", run_id, "--data", prompts, "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    table = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:4]}
    assert table == {"base": ["-", "-", "-", "-", "-", "6"], "final": ["-", "-", "-", "-", "-", "6"]}
    answers = [json.loads(line) for line in (eval_kept / "eval-answers" / "final.jsonl").read_text().splitlines()]
    assert [(a["prompt"], a["expected"], a["exact_match"]) for a in answers] == [
        (r["prompt"], None, None) for r in rows
    ]
    # The trained adapter answers most of these arithmetic prompts with a number, as it learned to.
    assert sum(a["answer"].strip().split("\n")[0].strip().isdigit() for a in answers) >= 4, answers

    # Some rows with their answer, some without: the loss and the scores are of those with one.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r if i % 2 else {"prompt": r["prompt"]}) + "\n" for i, r in enumerate(rows)))
    whole = tmp_path / "answered.jsonl"
    whole.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(rows) if i % 2))
    got = {}
    for data in (mixed, whole):
        done = tunedeck("eval", run_id, "--data", data, "--json", "--runs-dir", runs_dir)
        assert done.returncode == 0, done.stderr
        got[data.name] = json.loads(done.stdout)["adapter"]
    assert got["mixed.jsonl"]["examples"] == 6 and got["mixed.jsonl"]["generated"] == 6
    for key in ("loss", "tokens", "exact_match", "rouge_l"):
        assert got["mixed.jsonl"][key] == pytest.approx(got["answered.jsonl"][key]), key


def test_a_conversation_that_ends_with_the_users_turn_is_answered(chat_run, tmp_path):
    runs_dir, run_id = chat_run
    conversations = [json.loads(line)["messages"] for line in (runs_dir / "chat-data" / "conversations.jsonl").open()]
    asked = tmp_path / "asked.jsonl"  # each conversation without its last (assistant) turn
    asked.write_text("".join(json.dumps({"messages": c[:-1]}) + "\n" for c in conversations[:4]))
    result = tunedeck("eval", run_id, "--data", asked, "--json", "--runs-dir", runs_dir)
    assert result.returncode == 0, result.stderr
    adapter = json.loads(result.stdout)["adapter"]
    assert (adapter["loss"], adapter["exact_match"], adapter["generated"]) == (None, None, 4)
    answers = [json.loads(line) for line in (runs_dir / run_id / "eval-answers" / "final.jsonl").open()]
    assert [a["prompt"] for a in answers] == [c[:-1] for c in conversations[:4]] and all(a["answer"] for a in answers)
