"""KTO's job (objective=kto on answers labelled good or bad) through every layer that reads a job, without training.

tests/runs/test_kto.py and test_smoke_presets.py train it; here each layer says what a user sees of it:
validation and its fixes, the form, the files, the input checks, the memory and speed estimates, the preview,
an upload, evaluation's rows, the run view's charts and the CLI's progress line.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tunedeck.app.charts import PREFERENCE_PANELS, metrics_figure
from tunedeck.app.dataset_preview import preview_markdown
from tunedeck.backend import recipe
from tunedeck.backend.after import scoring
from tunedeck.backend.data.preview import preview
from tunedeck.backend.data.uploads import dataset_changes
from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.render import render_bundle
from tunedeck.backend.runs.summary import facts_line, run_title
from tunedeck.backend.spec import parse_spec, resolve_spec, set_paths
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import values_from_spec
from tunedeck.backend.validate import has_errors, validate

KTO = {"objective": "kto", "dataset.format": "unpaired-preference", "training.per_device_train_batch_size": 2}


def errors(spec) -> list:
    return [p for p in validate(spec) if p.level == "error"]


def fixed(spec, problem):
    """The job after the problem's one-click fix: it must validate clean."""
    spec = set_paths(spec, problem.fix)
    assert not has_errors(validate(spec)), [p.message for p in errors(spec)]
    return spec


def test_kto_reads_labelled_answers_or_pairs_and_labelled_answers_need_kto_each_with_its_fix():
    lora = set_paths(resolve_spec("7b-lora-ddp"), {"training.per_device_train_batch_size": 2})
    (problem,) = errors(set_paths(lora, {"objective": "kto"}))  # chat rows
    assert problem.field == "dataset.format" and "labelled good or bad" in problem.message
    assert fixed(set_paths(lora, {"objective": "kto"}), problem).dataset.format == "unpaired-preference"
    for objective in ("sft", "dpo"):  # labelled answers are no demonstrations and no pairs
        spec = set_paths(lora, {"objective": objective, "dataset.format": "unpaired-preference"})
        (problem,) = errors(spec)
        assert problem.field == "objective" and problem.fix == {"objective": "kto"}
        fixed(spec, problem)
    assert not errors(set_paths(lora, {"objective": "kto", "dataset.format": "preference"}))  # TRL splits pairs


def test_kto_needs_two_rows_per_gpu_for_its_kl_estimate():
    spec = set_paths(resolve_spec("demo-kto"), {"training.per_device_train_batch_size": 1})
    (problem,) = errors(spec)
    assert problem.field == "training.per_device_train_batch_size" and "KL estimate" in problem.message
    assert fixed(spec, problem).training.per_device_train_batch_size == 2


def test_the_form_shows_ktos_settings_only_for_kto():
    sft, dpo, kto = resolve_spec("demo"), resolve_spec("demo-dpo"), resolve_spec("demo-kto")
    shown = lambda spec, path: applies(path, values_from_spec(spec))  # noqa: E731
    assert shown(kto, "preference.beta") and shown(dpo, "preference.beta") and not shown(sft, "preference.beta")
    for weight in ("preference.desirable_weight", "preference.undesirable_weight"):
        assert shown(kto, weight) and not shown(dpo, weight) and not shown(sft, weight)
    assert shown(dpo, "preference.loss_type") and not shown(kto, "preference.loss_type")
    assert shown(kto, "dataset.label_field") and shown(kto, "dataset.completion_field")
    assert not shown(kto, "dataset.chosen_field") and not shown(kto, "dataset.packing")
    assert not shown(kto, "training.group_by_length")  # KTO samples in order: its KL answers are the neighbours'


def test_the_bundle_trains_with_ktoconfig_arguments():
    spec = set_paths(resolve_spec("demo-kto"), {"preference.beta": 0.2, "preference.desirable_weight": 1.33})
    args = yaml.safe_load(render_bundle(spec)["training_args.yaml"])
    assert (args["beta"], args["desirable_weight"], args["undesirable_weight"]) == (0.2, 1.33, 1.0)
    assert not {"loss_type", "packing", "dataset_text_field", "train_sampling_strategy"} & set(args)
    config_class, trainer_class = recipe.objective_classes({"objective": "kto"})
    assert (config_class.__name__, trainer_class.__name__) == ("KTOConfig", "KTOTrainer")


def test_labels_are_checked_before_launch_and_read_from_json_and_csv(tmp_path):
    from datasets import Dataset

    cfg = {"format": "unpaired-preference", "label_field": "thumbs_up"}
    good = tmp_path / "rated.jsonl"
    good.write_text("\n".join(json.dumps({"prompt": "2+2=", "completion": c, "thumbs_up": u}) for c, u in
                              ((" 4", True), (" 5", False))) + "\n")  # fmt: skip
    assert recipe.dataset_problems({**cfg, "path": str(good)}, tmp_path) == []
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "2+2=", "completion": " 4", "thumbs_up": "maybe"}) + "\n")
    ((field, message),) = recipe.dataset_problems({**cfg, "path": str(bad)}, tmp_path)
    assert field == "dataset.label_field" and "'maybe'" in message and "true (a good answer) or false" in message
    csv = tmp_path / "rated.csv"
    csv.write_text("prompt,completion,thumbs_up\n2+2=, 4,1\n2+2=, 5,0\n")
    assert recipe.dataset_problems({**cfg, "path": str(csv)}, tmp_path) == []
    rows = Dataset.from_list([{"prompt": "a", "completion": "b", "thumbs_up": v} for v in ("True", "0")])
    converted = recipe.to_trl_format(rows, cfg, "text")
    assert converted.column_names == ["prompt", "completion", "label"] and converted["label"] == [True, False]
    with pytest.raises(recipe.JobError, match=r"dataset.label_field: row 1 of column 'thumbs_up' holds 'no'"):
        recipe.to_trl_format(Dataset.from_list([{**rows[0], "thumbs_up": "true"}, {**rows[0], "thumbs_up": "no"}]),
                            cfg, "text")  # fmt: skip


def test_full_kto_holds_a_reference_copy_and_runs_about_twice_an_sft_step():
    full = resolve_spec("7b-full-zero2")
    sft, kto = estimate(full), estimate(set_paths(full, KTO))
    assert kto.breakdown["reference"] == pytest.approx(sft.breakdown["weights"], rel=0.01)
    assert kto.breakdown["activations"] == pytest.approx(sft.breakdown["activations"] * 2, rel=0.01)  # batch 2 vs 1
    h100 = speed.Hardware.named("H100")

    def compute(spec) -> float:
        return speed.predict(Job.from_values(input_values(spec)), h100, speed.schedule_of(spec, 10_000)).parts[
            "compute"
        ]

    lora = set_paths(resolve_spec("7b-lora-ddp"), {"training.per_device_train_batch_size": 2})
    # With activation checkpointing a LoRA token costs 3 forwards' FLOPs (forward, backward's 2), a KTO token 3
    # more (the reference on the answer, the model and the reference on the KL answer): twice the step.
    assert compute(set_paths(lora, KTO)) / compute(lora) == pytest.approx(2.0, abs=0.05)


def test_the_preview_marks_each_answer_good_or_bad(demo_home):
    shown = preview(resolve_spec("demo-kto"), rows=4)
    assert [row.split(":")[0] for row in shown["rows"]] == ["✓ good", "✗ bad", "✓ good", "✗ bad"]
    assert shown["format"] == "unpaired-preference" and not shown["packing"]


def test_the_preview_counts_good_and_bad_answers_and_says_which_weight_balances_them(tmp_path, demo_home):
    demo = preview(resolve_spec("demo-kto"), rows=0)["labels"]
    assert demo["good"] > 0 and abs(demo["good"] - demo["bad"]) <= 1 and demo["advice"] is None  # half and half
    rated = tmp_path / "rated.jsonl"
    rows = [{"prompt": f"Q{i}", "completion": " a", "label": i % 4 != 0} for i in range(40)]  # 30 good, 10 bad
    rated.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = set_paths(resolve_spec("demo-kto"), {"dataset.path": str(rated), "dataset.split": "train"})
    labels = preview(spec, rows=0)["labels"]
    assert (labels["good"], labels["bad"]) == (30, 10)
    # KTO paper: desirable x 30 / (undesirable x 10) within 1-1.33
    assert "preference.desirable_weight to 0.33-0.44, or preference.undesirable_weight to 2.26-3.00" in labels["advice"]
    for balanced in ({"preference.desirable_weight": 0.4}, {"preference.undesirable_weight": 2.5}):
        assert preview(set_paths(spec, balanced), rows=0)["labels"]["advice"] is None
    shown = preview_markdown(preview(spec, rows=0))
    assert "**Labels:** 30 good · 10 bad. ⚠ 30 good and 10 bad answers are out of balance" in shown


def test_an_uploaded_file_of_labelled_answers_trains_with_kto_and_pairs_stay_with_kto(tmp_path):
    rated = tmp_path / "rated.jsonl"
    rated.write_text(json.dumps({"prompt": "2+2=", "completion": "4", "label": True}) + "\n")
    changes, found, _ = dataset_changes(rated, held_out=False)
    assert found == "unpaired-preference" and changes["objective"] == "kto"
    spec = set_paths(resolve_spec("7b-lora-ddp"), {**changes, "training.per_device_train_batch_size": 2})
    assert not has_errors(validate(spec))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "2+2=", "chosen": "4", "rejected": "5"}) + "\n")
    assert dataset_changes(pairs, held_out=False)[0]["objective"] == "dpo"
    assert "objective" not in dataset_changes(pairs, held_out=False, objective="kto")[0]  # KTO reads pairs too


def test_evaluation_scores_the_answers_labelled_good(tmp_path):
    path = tmp_path / "rated.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{n}+{n}=", "completion": c, "label": good}) + "\n"
                            for n, c, good in ((1, " 2", True), (2, " 5", False), (3, " 6", True))))  # fmt: skip
    cfg = {"format": "unpaired-preference", "path": str(path)}
    assert scoring._read_rows(cfg, "train", str(path), None) == [
        {"prompt": "1+1=", "completion": " 2"},
        {"prompt": "3+3=", "completion": " 6"},
    ]


def test_a_kto_runs_charts_progress_line_and_title_say_kto():
    steps = [{"step": s, "loss": 0.5 - s / 10, "reward_margin": s, "reward_chosen": s / 2, "reward_rejected": -s / 2,
              "kl": 0.01 * s} for s in (1, 2, 3)]  # fmt: skip
    steps.append({"step": 3, "eval_loss": 0.3, "eval_reward_margin": 2.5, "eval_kl": 0.02})
    fig = metrics_figure(steps)
    titles = [a.text for a in fig.layout.annotations]
    assert all(title in titles for _, title in PREFERENCE_PANELS["unpaired"])
    assert not any(title in titles for _, title in PREFERENCE_PANELS["pairs"])
    assert {"kl", "eval kl", "reward margin", "eval reward margin"} <= {trace.name for trace in fig.data}
    job = parse_spec(yaml.safe_load(render_bundle(resolve_spec("demo-kto"))["job.yaml"]))
    assert run_title(job) == "demo/model · lora kto · ddp · 2xCPU"
    start = {"world_size": 2, "objective": "kto", "reference": "adapters off"}
    assert facts_line(start).endswith("KTO, reference: adapters off")
