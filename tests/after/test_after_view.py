"""The Try / Evaluate / Export tab's handlers, called as the page will call them (no browser)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from runs.helpers import fake_run

from tunedeck.app.after_view import AfterView
from tunedeck.app.eval_display import EVAL_HEADERS
from tunedeck.app.export_view import merge, merge_dir, push
from tunedeck.app.try_turns import next_turns
from tunedeck.backend.after.eval_results import save_results
from tunedeck.backend.after.examples import verdict
from tunedeck.backend.after.prompting import SettingsError
from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.spec import resolve_spec, spec_to_dict

from .helpers import CHAT_SYSTEM, gone

RUN_ID = "20250101-120000-abcdef"


@pytest.fixture
def sharded_run(tmp_path):
    """A finished run folder whose output holds a ZeRO checkpoint, an FSDP one and the final adapter."""
    folder = fake_run(tmp_path, RUN_ID, "finished", None)
    (folder / "job.yaml").write_text(yaml.safe_dump(spec_to_dict(resolve_spec("demo"))))
    out = folder / "output"
    (out / "checkpoint-2" / "global_step2").mkdir(parents=True)
    (out / "checkpoint-2" / "latest").write_text("global_step2")
    (out / "checkpoint-4" / "pytorch_model_fsdp_0").mkdir(parents=True)
    (out / "checkpoint-4" / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"")
    (out / "checkpoint-9").mkdir()  # no weights in it: not offered
    (out / "adapter_model.safetensors").write_bytes(b"")
    return AfterView(RunManager(tmp_path))


def test_weights_are_offered_newest_first_with_how_they_are_stored(sharded_run):
    assert sharded_run.weights_choices(RUN_ID) == [
        ("final adapter", "final"),
        ("checkpoint-4 · FSDP shards, consolidated on first use", "checkpoint-4"),
        ("checkpoint-2 · ZeRO shards, consolidated on first use", "checkpoint-2"),
        ("base model (no adapter)", "base"),
    ]
    assert sharded_run.compare_choices(RUN_ID)[:2] == [("no comparison", ""), ("the base model", "base")]


def test_merged_models_stay_inside_the_run_folder(sharded_run):
    assert (
        merge_dir(sharded_run, RUN_ID, "merged-bf16") == sharded_run.manager.run_dir(RUN_ID) / "merged" / "merged-bf16"
    )
    for name in ("../escape", "a/b", "/abs", "", ".hidden", "x" * 65):
        with pytest.raises(AfterError, match="^merge name: "):
            merge_dir(sharded_run, RUN_ID, name)
    with pytest.raises(AfterError, match="not the base model"):
        next(merge(sharded_run, RUN_ID, "base", "ok", "float32"))


def test_bad_inputs_are_messages_before_any_worker_starts(sharded_run):
    with pytest.raises(AfterError, match="^prompt: "):
        next(sharded_run.answer(RUN_ID, "final", "", "  ", {}))
    with pytest.raises(SettingsError, match="^temperature: "):
        next(sharded_run.answer(RUN_ID, "final", "", "hi", {"temperature": 9}))
    with pytest.raises(AfterError, match="is not a run id"):
        sharded_run.weights_choices("../../etc")
    assert sharded_run.pool.live() == {}


def test_evaluation_results_show_again_from_the_run_folder(sharded_run):
    before = sharded_run.eval_view(RUN_ID)
    assert before["after.eval_status"] == "not evaluated yet"
    # No empty axes before an evaluation (plotly's default frame reads -1..6): a note in their place.
    assert not before["after.eval_chart"].data and "Evaluate" in before["after.eval_chart"].layout.annotations[0].text
    save_results(
        sharded_run.manager.run_dir(RUN_ID),
        {
            "final": {
                "loss": 1.08123,
                "exact_match": 0.095,
                "rouge_l": 0.61234,
                "data": "/d/eval.jsonl",
                "device": "cpu",
            },
            "base": {"loss": 8.06, "exact_match": 0.0},  # measured before ROUGE-L was: "—"
        },
    )
    view = sharded_run.eval_view(RUN_ID)
    assert view["after.eval_table"]["headers"] == EVAL_HEADERS  # no benchmark or general-text column: none measured
    rows = view["after.eval_table"]["data"]
    assert [row[:2] for row in rows] == [["base", 8.06], ["final", 1.0812]]
    assert view["after.eval_status"] == "last evaluated on `/d/eval.jsonl` on cpu"  # the table says eval.jsonl
    assert [row[-1] for row in rows] == [None, "eval.jsonl"]
    assert [row[EVAL_HEADERS.index("ROUGE-L")] for row in rows] == ["—", 0.6123]  # not measured
    chart = view["after.eval_chart"]
    assert list(chart.data[0].x) == ["base", "final"] and list(chart.data[1].y) == [0.0, 0.095]
    assert chart.data[2].name == "ROUGE-L" and list(chart.data[2].y) == [None, 0.61234]


def test_benchmark_scores_and_the_general_text_loss_join_the_table_the_chart_and_the_status(sharded_run):
    def measured(loss, score, text_loss):
        bench = {"metric": "exact_match", "score": score, "scores": {"exact_match": score}, "samples": 20, "of": 131}
        text = {"loss": text_loss, "perplexity": 1.0, "tokens": 4528, "source": "built-in"}
        return {"loss": loss, "benchmarks": {"demo_arith": bench}, "general_text": text, "data": "/d/eval.jsonl"}

    save_results(
        sharded_run.manager.run_dir(RUN_ID), {"base": measured(8.1, 0.0, 8.34), "final": measured(1.3, 0.1, 10.61)}
    )
    view = sharded_run.eval_view(RUN_ID)
    table = view["after.eval_table"]
    assert table["headers"] == [*EVAL_HEADERS[:-2], "demo_arith", "general-text loss", *EVAL_HEADERS[-2:]]
    assert [row[7:9] for row in table["data"]] == [[0.0, 8.34], [0.1, 10.61]]
    assert "⚠ final: general-text loss rose 2.27 (8.34 → 10.61, +27%): the adapter forgot" in view["after.eval_status"]
    traces = {trace.name: list(trace.y) for trace in view["after.eval_chart"].data}
    assert traces["general-text loss"] == [8.34, 10.61] and traces["demo_arith (exact_match)"] == [0.0, 0.1]


def test_the_pages_benchmark_boxes_become_the_workers_arguments_and_a_bad_text_file_is_said(tmp_path):
    from tunedeck.app.eval_display import eval_checks, refused

    assert eval_checks("", 20, False, None) == {}
    assert eval_checks("demo_arith, demo_arith hellaswag", 0, True, None) == {
        "tasks": ["demo_arith", "hellaswag"],
        "tasks_limit": None,
        "general_text": "built-in",
    }
    (tmp_path / "prose.txt").write_text("Some everyday prose.")
    assert eval_checks(None, 20, False, str(tmp_path / "prose.txt")) == {"general_text": str(tmp_path / "prose.txt")}
    (tmp_path / "blank.txt").write_text(" ")
    with pytest.raises(AfterError) as bad:
        eval_checks(None, 20, True, str(tmp_path / "blank.txt"))
    assert (
        refused(bad.value) == "✗ General text: blank.txt holds no text; upload a plain-text (UTF-8) file of "
        "general prose, or clear the box for the built-in sample"
    )


@pytest.mark.integration
def test_answers_stream_side_by_side_and_merge_lands_in_the_run(demo_run, demo_home):
    runs_dir, run_id = demo_run
    view = AfterView(RunManager(runs_dir))
    try:
        updates = list(view.answer(run_id, "final", "base", "Q: Add the numbers. 3 + 4\nA:", {"max_new_tokens": 6}))
        assert updates[0]["after.status"].startswith("loading the models")
        assert "the final adapter on cpu, the base model alone on cpu" in updates[-2]["after.status"]
        last = {k: v for update in updates for k, v in update.items()}  # what the page shows at the end
        assert last["after.answer"].strip()[:1].isdigit() and last["after.answer"] != last["after.compare_answer"]
        # Then how each answer went, one line per model, and the warning the models share.
        tuned, base, warning = last["after.status"].split("\n\n")
        assert re.fullmatch(
            r"\*\*the final adapter\*\* on cpu: \d+ tokens? in [\d.]+ s.* · ended at its end-of-sequence token"
            r" · the prompt 15 tokens",
            tuned,
        )
        assert base.startswith("**the base model alone** on cpu: 6 tokens in ")
        assert base.endswith("cut at max new tokens · the prompt 15 tokens")
        assert warning.startswith("⚠ no NVIDIA GPU found")

        # An example from the held-out data, judged against the data's answer as evaluation judges it.
        example = view.example(run_id, 3)
        row = json.loads((demo_home / "data" / "eval.jsonl").read_text().splitlines()[2])
        assert (example["after.prompt"], example["after.expected"]) == (row["prompt"], row["completion"])
        assert example["after.example_note"].startswith("example 3 of 200, a held-out row of eval.jsonl")
        updates = list(view.answer(run_id, "final", "", row["prompt"], {}, expected=row["completion"]))
        answer = [u["after.answer"] for u in updates if "after.answer" in u][-1]
        judged = verdict(answer, row["completion"])  # unit-tested in test_examples.py
        assert updates[-1]["after.status"].startswith("**the final adapter** on cpu: ")
        assert judged in updates[-1]["after.status"]
        pids = [w.pid for w in view.pool.live().values()]
        assert len(pids) == 2
        assert view.release(run_id)["after.status"] == f"released 2 models of run {run_id}"
        assert all(gone(pid) for pid in pids)

        steps = list(merge(view, run_id, "checkpoint-30", "ckpt30", "float32"))
        assert any("merging the adapter" in s["after.merge_status"] for s in steps)
        out = runs_dir / run_id / "merged" / "ckpt30"
        assert steps[-1]["after.merge_status"].startswith(f"saved to {out}")
        assert (out / "model.safetensors").is_file() and (out / "serve.sh").is_file()
        # then the export check, in the same worker: the merged float32 folder answers as checkpoint 30 does
        assert any("held-out prompts" in s["after.merge_status"] for s in steps[:-1])
        assert "✓ `ckpt30`: **24/24 answers identical after export**" in steps[-1]["after.merge_status"]

        scored = list(view.evaluate(run_id, "final", limit=8))
        assert any(s.get("after.eval_status", "").startswith("base: loss") for s in scored)
        assert [row[0] for row in scored[-1]["after.eval_table"]["data"]][:1] == ["base"]
        assert "final" in [row[0] for row in scored[-1]["after.eval_table"]["data"]]
        # Each answer beside the base's and the data's, for the 8 examples just evaluated; the file has them all.
        table = scored[-1]["after.answers"]
        assert table["headers"] == ["#", "prompt", "the data's answer", "base", "final"]
        rows = [json.loads(line) for line in (demo_home / "data" / "eval.jsonl").read_text().splitlines()[:8]]
        assert [r[1:3] for r in table["data"]] == [[r["prompt"], r["completion"].strip()] for r in rows]
        assert scored[-1]["after.answers_note"].startswith("8 examples · the data's answer exactly (✓): base ")
        download = [json.loads(line) for line in open(scored[-1]["after.answers_file"])]
        assert [d["prompt"] for d in download] == [r["prompt"] for r in rows]
        assert set(download[0]["answers"]) == {"base", "final"}
        differ = view.answers_view(run_id, "differ")["after.answers"]["data"]
        assert all(len({cell[2:] for cell in r[3:]}) == 2 for r in differ)  # the base's and the adapter's differ
        # A row of the table goes into the Try box as an example of the data would.
        again = view.evaluated_example(run_id, 5)
        assert (again["after.prompt"], again["after.expected"]) == (rows[4]["prompt"], rows[4]["completion"])
        assert again["after.example_note"].startswith("example 5 of 8, a held-out row of eval.jsonl")
        with pytest.raises(AfterError, match=r"^example: 9 is not between 1 and 8"):
            view.evaluated_example(run_id, 9)
    finally:
        view.pool.release_all()


def test_the_run_list_offers_runs_that_saved_an_adapter_or_a_checkpoint(sharded_run, tmp_path):
    fake_run(tmp_path, "20250101-130000-abcdef", "running", None).joinpath("job.yaml").write_text(
        yaml.safe_dump(spec_to_dict(resolve_spec("demo")))
    )  # live, nothing saved yet: not offered
    [(label, run_id)] = sharded_run.run_choices()
    assert run_id == RUN_ID and label.startswith(f"{RUN_ID} · finished · final adapter")


def test_a_merge_never_overwrites_and_push_without_network_says_so(sharded_run, monkeypatch):
    with pytest.raises(AfterError, match="^merge name: .* holds no merged model yet; Merge first"):
        push(sharded_run, RUN_ID, "done", "someone/model", "")
    out = merge_dir(sharded_run, RUN_ID, "done")
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    with pytest.raises(AfterError, match="^merge name: .* already holds a merged model"):
        next(merge(sharded_run, RUN_ID, "final", "done", "float32"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: as without network
    with pytest.raises(AfterError, match="^push: cannot reach the Hugging Face Hub"):
        push(sharded_run, RUN_ID, "done", "someone/model", "hf_not_a_real_token")
    with pytest.raises(AfterError, match="^Hub repo id: "):
        push(sharded_run, RUN_ID, "done", "no owner", "")


def _prompt_tokens(status: str, model: str) -> int:
    line = next(line for line in status.split("\n\n") if line.startswith(f"**{model}**"))
    return int(re.search(r"the prompt (\d+) tokens", line).group(1))


@pytest.mark.integration
def test_a_chat_run_converses_each_model_seeing_its_own_earlier_turns(chat_run, demo_run, demo_home):
    runs_dir, run_id = chat_run
    view = AfterView(RunManager(runs_dir))
    assert view.converses(run_id) and not view.converses(demo_run[1])
    try:
        # No held-out file beside the data: the example is a training row, and says so; its system message
        # and its earlier turn come with it.
        example = view.example(run_id, 2)
        assert example["after.prompt"] == "Add the numbers. 9 + 0" and example["after.expected"] == "9"
        assert example["after.example_note"] == (
            "example 2 of 400, a training row (the model has seen it) of conversations.jsonl · with its system "
            "message and 1 earlier turn: **Answer** sends it as the run trained on it."
        )
        assert (example["after.system"], example["turns"]) == (CHAT_SYSTEM, [("Subtract the numbers. 1 - 0", "1")])
        assert view.example(run_id, 2, conversing=False)["turns"] == []
        settings = {"max_new_tokens": 4}
        first = list(view.answer(run_id, "final", "base", example["after.prompt"], settings, history={}))
        turns = first[-1]["after.history"]
        tuned = turns["after.answer"][0][1]
        assert turns["after.answer"] == [("Add the numbers. 9 + 0", tuned)]
        assert turns["after.compare_answer"][0][0] == "Add the numbers. 9 + 0"  # the base's own answer beside

        second = list(view.answer(run_id, "final", "base", "And 2 + 2?", settings, history=turns))
        shown = [u["after.answer"] for u in second if "after.answer" in u][-1]
        assert shown.startswith(f"> Add the numbers. 9 + 0\n{tuned}\n\n> And 2 + 2?\n")
        assert [u for u, _ in second[-1]["after.history"]["after.answer"]] == ["Add the numbers. 9 + 0", "And 2 + 2?"]
        # The earlier turn went through the chat template with the new prompt: a longer prompt for each model.
        for model in ("the final adapter", "the base model alone"):
            assert _prompt_tokens(second[-2]["after.status"], model) > _prompt_tokens(first[-2]["after.status"], model)

        # The example as the run trained on it: the system message and the earlier turn, then its prompt:
        # token for token the conversation the chat template renders from the data's row.
        earlier = dict.fromkeys(("after.answer", "after.compare_answer"), example["turns"])
        framed = list(view.answer(run_id, "final", "base", example["after.prompt"], settings, history=earlier,
                                  system=example["after.system"]))  # fmt: skip
        shown = [u["after.answer"] for u in framed if "after.answer" in u][-1]
        assert shown.startswith("> Subtract the numbers. 1 - 0\n1\n\n> Add the numbers. 9 + 0\n"), shown
        row = json.loads(Path(view.manager.job(run_id).dataset.path).read_text().splitlines()[1])["messages"]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
        trained = tokenizer.apply_chat_template(row[:-1], add_generation_prompt=True, tokenize=True, return_dict=True)
        for model in ("the final adapter", "the base model alone"):
            assert _prompt_tokens(framed[-2]["after.status"], model) == len(trained["input_ids"])
    finally:
        view.pool.release_all()

    # A run without conversations answers each prompt alone, whatever history the page holds.
    view = AfterView(RunManager(demo_run[0]))
    try:
        updates = list(view.answer(demo_run[1], "final", "", "Q: Add the numbers. 3 + 4\nA:", settings, history={}))
        assert updates[-1] == {"after.history": {}}
        assert not [u["after.answer"] for u in updates if "after.answer" in u][-1].startswith(">")
    finally:
        view.pool.release_all()


def test_a_model_that_fails_to_answer_keeps_its_conversation_for_the_next_prompt():
    history = {"after.answer": [("hi", "1")], "after.compare_answer": [("hi", "2")]}
    boxes = ("after.answer", "after.compare_answer")
    after = next_turns(history, "again", {"after.answer": "3"}, boxes)  # the model beside failed this time
    assert after == {"after.answer": [("hi", "1"), ("again", "3")], "after.compare_answer": [("hi", "2")]}
    assert history["after.answer"] == [("hi", "1")]  # the page's state is not changed in place
    assert next_turns({}, "hi", {}, ("after.answer",)) == {}  # no chat template: no conversation to keep
