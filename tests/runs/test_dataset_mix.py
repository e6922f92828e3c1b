"""dataset.mix for real: the datasets library reads each source, #ROWS samples or repeats it, and a run trains on all.

The demo's questions split by kind: addition alone as the job's dataset, subtraction mixed in.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tunedeck.backend import recipe
from tunedeck.backend.spec import resolve_spec

from .helpers import log_records, read_metrics, split_demo_files, start_record
from .test_training_runs import assert_finished, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def split_demo(demo_home, tmp_path) -> tuple[Path, Path]:
    """(additions, subtractions): the demo's training rows of each kind, in two files."""
    return split_demo_files(demo_home, tmp_path)


def prompts(dataset) -> Counter:
    return Counter(dataset["prompt"])


def test_rows_are_sampled_without_repeats_or_repeated_whole(split_demo):
    adds, subs = split_demo
    config = {"path": str(adds), "format": "prompt-completion", "mix": [f"{subs}#100", f"{subs}:train[:10]#25"]}
    main = recipe.to_trl_format(recipe.load_split(config, "train"), config, "text")
    mixed, rows = recipe.mixed_in(main, config, "text", seed=42)
    assert rows == {"dataset.path": len(main), f"{subs}#100": 100, f"{subs}:train[:10]#25": 25}
    assert len(mixed) == len(main) + 125 and mixed.column_names == ["prompt", "completion"]
    sample = mixed.select(range(len(main), len(main) + 100))
    assert all(p.startswith("Q: Subtract") for p in sample["prompt"])
    first_ten = recipe.to_trl_format(recipe.load_split({**config, "path": str(subs)}, "train[:10]"), config, "text")
    repeated = prompts(mixed.select(range(len(main) + 100, len(mixed))))
    # 25 rows of a 10-row slice: every row twice, then 5 of them (each once) a third time
    twice = Counter({prompt: 2 * n for prompt, n in prompts(first_ten).items()})
    third = repeated - twice
    assert not twice - repeated and third.total() == 5 and not third - prompts(first_ten)
    again, _ = recipe.mixed_in(main, config, "text", seed=42)
    assert again["prompt"] == mixed["prompt"]  # the same seed, the same rows
    other, _ = recipe.mixed_in(main, config, "text", seed=7)
    assert other["prompt"] != mixed["prompt"]


def test_a_source_in_another_layout_is_refused_with_its_entry(split_demo, tmp_path):
    adds, _ = split_demo
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"prompt": [{"role": "user", "content": "1 + 1"}], "completion": "2"}) + "\n")
    config = {"path": str(adds), "format": "prompt-completion", "mix": [str(chats)]}
    main = recipe.to_trl_format(recipe.load_split(config, "train"), config, "text")
    with pytest.raises(recipe.JobError, match=rf"^dataset.mix '{chats}': its rows do not have the main dataset's"):
        recipe.mixed_in(main, config, "text", seed=42)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_source_in_another_format_joins_converted(demo_home):
    """A chat job takes alpaca rows (instruction and input as the user's turn) and prompt-completion rows as chats; a
    text job takes a prompt and its completion as one text; a source whose rows cannot join is refused, saying why."""
    formats = demo_home / "formats"
    alpaca, completions = formats / "alpaca.jsonl", formats / "prompt-completion.jsonl"
    chat = {"path": str(formats / "messages.jsonl"), "format": "messages", "mix": [f"{alpaca}#4", f"{completions}#4"]}
    main = recipe.to_trl_format(recipe.load_split(chat, "train"), chat, "text")
    mixed, rows = recipe.mixed_in(main, chat, "text", seed=42)
    assert mixed.column_names == ["messages"] and rows == {
        "dataset.path": len(main),
        f"{alpaca}#4": 4,
        f"{completions}#4": 4,
    }
    turns = [[(m["role"], m["content"]) for m in chat] for chat in mixed["messages"][len(main) :]]
    said = {r["instruction"] + (f"\n\n{r['input']}" if r["input"] else ""): r["output"] for r in rows_of(alpaca)}
    for turn in turns[:4]:
        asked = turn[0][1]
        assert turn == [("user", asked), ("assistant", said[asked])]
    answers = {r["prompt"]: r["completion"] for r in rows_of(completions)}
    for turn in turns[4:]:
        asked = turn[0][1]
        assert turn == [("user", asked), ("assistant", answers[asked])]

    text = {"path": str(formats / "text.jsonl"), "format": "text", "mix": [f"{completions}#3"]}
    main = recipe.to_trl_format(recipe.load_split(text, "train"), text, "text")
    mixed, _ = recipe.mixed_in(main, text, "text", seed=42)
    assert mixed.column_names == ["text"]
    assert set(mixed["text"][len(main) :]) <= {r["prompt"] + r["completion"] for r in rows_of(completions)}

    completion_job = {"path": str(completions), "format": "prompt-completion", "mix": [str(formats / "messages.jsonl")]}
    main = recipe.to_trl_format(recipe.load_split(completion_job, "train"), completion_job, "text")
    refused = (
        "its columns \\(messages\\) are the messages format's, and messages rows cannot join a prompt-completion job"
    )
    with pytest.raises(recipe.JobError, match=rf"^dataset.mix '.*messages.jsonl': {refused}; mix in rows of these "
                       "formats: prompt-completion, alpaca$"):  # fmt: skip
        recipe.mixed_in(main, completion_job, "text", seed=42)


def test_a_chat_job_trains_on_alpaca_rows_mixed_in(demo_home, runs_dir):
    formats = demo_home / "formats"
    spec = resolve_spec(
        "demo",
        [f"dataset.path={formats / 'messages.jsonl'}", "dataset.format=messages", "dataset.packing=false",
         f"dataset.mix={formats / 'alpaca.jsonl'}#100", "training.max_steps=4"],
    )  # fmt: skip
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    start = start_record(manager.run_dir(run_id))
    assert start["dataset_rows"]["dataset.path"] > 0 and start["dataset_rows"][f"{formats / 'alpaca.jsonl'}#100"] == 100
    # chats keep their source through TRL's chat template too
    sources = [set(r["loss_by_source"]) for r in log_records(manager.run_dir(run_id))]
    assert {"dataset.path", f"{formats / 'alpaca.jsonl'}#100"} in sources


def test_a_run_trains_on_the_mixed_in_rows_and_logs_each_sources_loss(split_demo, runs_dir):
    """One epoch of both sources; each source's training loss at every logging step and its held-out loss at every
    evaluation (its own rows of the eval split), the logged loss a mean of them (source_loss.py)."""
    adds, subs = split_demo
    mixed = f"{subs}:train[:90%]#300"
    spec = resolve_spec(
        "demo",
        [
            f"dataset.path={adds}", f"dataset.mix={mixed}", "dataset.packing=false",
            "dataset.split=train[:90%]", "dataset.eval_split=train[90%:]", "training.eval_steps=20",
            "training.max_steps=-1", "training.num_train_epochs=1", "training.per_device_train_batch_size=8",
            "training.gradient_accumulation_steps=1",
        ],
    )  # fmt: skip
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    run_dir = manager.run_dir(run_id)
    start = start_record(run_dir)
    additions = len(recipe.load_split({"path": str(adds)}, "train[:90%]"))
    assert start["dataset_rows"] == {"dataset.path": additions, mixed: 300}
    # One epoch of both, 16 rows a step on 2 ranks: the trainer counted the mixed-in rows
    assert start["max_steps"] == -(-(additions + 300) // 16)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"dataset: {additions + 300:,} training rows: {additions:,} from dataset.path, 300 from {mixed}" in log

    names = {"dataset.path", mixed}
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == list(range(1, start["max_steps"] + 1))
    assert all(r["loss_by_source"] and set(r["loss_by_source"]) <= names for r in logs)
    for record in logs:  # a step's loss is its tokens' mean: its one source's, or between its sources' means
        by_source = record["loss_by_source"].values()
        assert min(by_source) - 1e-4 <= record["loss"] <= max(by_source) + 1e-4, record
    both = [r["loss_by_source"] for r in logs if set(r["loss_by_source"]) == names]
    assert len(both) > len(logs) / 2  # the sampler groups rows by length: a step may hold one source only
    for name in names:  # both sources were learned
        assert sum(b[name] for b in both[-5:]) / 5 < both[0][name] / 2, (both[0], both[-5:])
    evals = [r for r in read_metrics(run_dir) if r["event"] == "log" and "eval_loss" in r]
    assert [r["step"] for r in evals] == [20, 40, start["max_steps"]] and all(
        set(r["eval_loss_by_source"]) == names for r in evals
    )
    for record in evals:  # the evaluation's loss is a mean over batches of both sources' rows
        by_source = record["eval_loss_by_source"].values()
        assert min(by_source) * 0.9 <= record["eval_loss"] <= max(by_source) * 1.1, record
