"""DPO's job (objective=dpo on preference pairs) through every layer that reads a job, without training.

tests/runs/test_dpo.py and test_smoke_presets.py train it; here each layer says what a user sees of it:
validation and its fixes, the form, the files, the memory estimate, the preview, an upload, evaluation's
rows and the run view's charts.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tunedeck.app.charts import PREFERENCE_PANELS, metrics_figure
from tunedeck.backend import recipe
from tunedeck.backend.after import evaluate, scoring
from tunedeck.backend.data.uploads import dataset_changes
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import resolve_spec, set_paths
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import values_from_spec
from tunedeck.backend.validate import has_errors, validate

DPO = {"objective": "dpo", "dataset.format": "preference"}


def errors(spec) -> list:
    return [p for p in validate(spec) if p.level == "error"]


def test_dpo_needs_preference_pairs_and_pairs_need_dpo_each_with_its_fix():
    spec = set_paths(resolve_spec("7b-lora-ddp"), {"objective": "dpo"})
    (problem,) = errors(spec)
    assert problem.field == "dataset.format" and "preference pairs" in problem.message
    assert not has_errors(validate(set_paths(spec, problem.fix)))
    spec = set_paths(resolve_spec("7b-lora-ddp"), {"dataset.format": "preference"})
    (problem,) = errors(spec)
    assert problem.field == "objective" and problem.fix == {"objective": "dpo"}
    assert not has_errors(validate(set_paths(spec, problem.fix)))


def test_the_form_shows_dpos_settings_only_for_dpo_and_packing_only_for_sft():
    sft, dpo = resolve_spec("demo"), resolve_spec("demo-dpo")
    shown = lambda spec, path: applies(path, values_from_spec(spec))  # noqa: E731
    assert not shown(sft, "preference.beta") and shown(dpo, "preference.beta")
    assert shown(sft, "dataset.packing") and not shown(dpo, "dataset.packing")
    assert shown(dpo, "dataset.chosen_field") and not shown(sft, "dataset.chosen_field")
    assert shown(dpo, "dataset.prompt_field")  # shared with prompt-completion


def test_the_bundle_trains_with_dpoconfig_arguments_and_says_the_objective():
    files = render_bundle(set_paths(resolve_spec("demo-dpo"), {"preference.beta": 0.3, "preference.loss_type": "ipo"}))
    args = yaml.safe_load(files["training_args.yaml"])
    assert (args["beta"], args["loss_type"], args["max_length"]) == (0.3, "ipo", 64)
    assert not {"packing", "dataset_text_field", "assistant_only_loss", "train_sampling_strategy"} & set(args)
    assert yaml.safe_load(files["job.yaml"])["objective"] == "dpo"
    sft_args = yaml.safe_load(render_bundle(resolve_spec("demo"))["training_args.yaml"])
    assert "beta" not in sft_args and sft_args["packing"] is True


def test_full_dpo_holds_a_reference_copy_and_lora_dpo_none():
    full = resolve_spec("7b-full-zero2")
    sft, dpo = estimate(full), estimate(set_paths(full, DPO))
    # The frozen reference is the model's weights again (16-bit, replicated under ZeRO-2).
    assert dpo.breakdown["reference"] == pytest.approx(sft.breakdown["weights"], rel=0.01)
    assert dpo.breakdown["activations"] > sft.breakdown["activations"]  # chosen and rejected: twice the rows
    zero3 = set_paths(full, {**DPO, "strategy.kind": "zero3"})
    assert estimate(zero3).breakdown["reference"] == pytest.approx(dpo.breakdown["reference"] / 8, rel=0.01)
    lora = estimate(set_paths(resolve_spec("7b-lora-ddp"), DPO))
    assert lora.breakdown["reference"] == 0  # the base with the adapters off is the reference


def test_an_uploaded_file_of_pairs_is_read_as_preference_data_for_dpo(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "2+2=", "chosen": "4", "rejected": "5"}) + "\n")
    changes, found, _ = dataset_changes(data, held_out=False)
    assert found == "preference" and changes["objective"] == "dpo"
    assert not has_errors(validate(set_paths(resolve_spec("7b-lora-ddp"), changes)))


def test_the_trainer_and_evaluation_read_pairs_under_any_column_names(tmp_path):
    from datasets import Dataset

    rows = [{"q": "2+2=", "good": " 4", "bad": " 5", "extra": 1}]
    cfg = {"format": "preference", "prompt_field": "q", "chosen_field": "good", "rejected_field": "bad"}
    converted = recipe.to_trl_format(Dataset.from_list(rows), cfg, "text")
    assert converted.column_names == ["prompt", "chosen", "rejected"] and converted[0]["chosen"] == " 4"
    with pytest.raises(recipe.JobError, match=r"dataset.rejected_field: column 'rejected'"):
        recipe.to_trl_format(Dataset.from_list(rows), {**cfg, "rejected_field": ""}, "text")
    # Evaluation scores a pair's chosen answer; a file of prompts alone is answered, not scored.
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    read = scoring._read_rows({**cfg, "path": str(path)}, "train", str(path), None)
    assert read == [{"prompt": "2+2=", "completion": " 4", "rejected": " 5"}]
    path.write_text(json.dumps({"q": "3+3="}) + "\n")
    read = scoring._read_rows({**cfg, "path": str(path)}, "train", str(path), None, answers_optional=True)
    assert read == [{"prompt": "3+3=", "completion": None}]


def test_a_dpo_runs_charts_add_its_rewards_below_the_training_metrics():
    steps = [{"step": s, "loss": 0.5, "reward_accuracy": 0.8, "reward_margin": 1.0 + s, "reward_chosen": 0.5,
              "reward_rejected": -0.5 - s} for s in (1, 2, 3)]  # fmt: skip
    steps.append({"step": 3, "eval_loss": 0.4, "eval_reward_accuracy": 0.75, "eval_reward_margin": 2.0})
    fig = metrics_figure(steps)
    titles = [a.text for a in fig.layout.annotations]
    assert all(title in titles for _, title in PREFERENCE_PANELS["pairs"])
    names = {trace.name for trace in fig.data}
    assert {"reward accuracy", "eval reward accuracy", "reward chosen", "reward rejected"} <= names
    assert not any("reward" in (a.text or "") for a in metrics_figure([{"step": 1, "loss": 1.0}]).layout.annotations)


def test_the_preview_shows_each_pair_as_the_model_reads_it_and_measures_its_longer_side(demo_home):
    from tunedeck.backend.data.preview import preview

    result = preview(resolve_spec("demo-dpo"), rows=1, limit=50)
    (row,) = result["rows"]
    chosen, rejected = row.split("\n\n✗ rejected:\n")
    assert chosen.startswith("✓ chosen:\nQ: ") and chosen.endswith("</s>") and rejected.endswith("</s>")
    assert result["packing"] is False  # DPO pads its pairs, whatever dataset.packing says
    assert result["rows_in_split"] >= 1000


def test_evaluation_scores_how_often_a_model_prefers_the_chosen_answer(demo_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(demo_home / "model")
    tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
    # A longer answer holds the shorter one's tokens and more: its summed log-probability is lower for any model.
    short, long = " 9", " 9 + 0 + 9 + 0 + 9"
    pairs = [{"prompt": f"Q: Add the numbers. 9 + {n}\nA:", "completion": short, "rejected": long} for n in range(3)]
    assert evaluate.score(model, tokenizer, pairs, 64)["preferred"] == 1.0
    swapped = [{**p, "completion": long, "rejected": short} for p in pairs]
    result = evaluate.score(model, tokenizer, swapped, 64)
    assert result["preferred"] == 0.0 and result["examples"] == 3
    assert evaluate.score(model, tokenizer, [{"prompt": "Q:", "completion": " 1"}], 64)["preferred"] is None


def test_a_dpo_step_costs_two_sequences_and_a_reference_forward_pass():
    from tunedeck.backend.estimate import speed
    from tunedeck.backend.estimate.memory_job import Job, input_values

    h100 = speed.Hardware.named("H100")

    def predicted(spec):
        return speed.predict(Job.from_values(input_values(spec)), h100, speed.schedule_of(spec, 10_000))

    sft = resolve_spec("7b-lora-ddp")
    dpo = set_paths(sft, DPO)
    # Per token, LoRA's forward and backward are 2 forwards' FLOPs (no weight gradients but the adapters') and
    # the reference adds one forward: 1.5 x; each row is two sequences: about 3 x the compute per step (a little
    # less: the larger micro batch uses the GPU better).
    ratio = predicted(dpo).parts["compute"] / predicted(sft).parts["compute"]
    assert 2.3 < ratio < 3.0
    assert predicted(dpo).tokens_per_s_per_gpu < predicted(sft).tokens_per_s_per_gpu
