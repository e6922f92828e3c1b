"""GRPO's job (objective=grpo on prompts, scored by rewards) through the layers that read a job, without training.

tests/runs/test_grpo.py trains the demo and test_smoke_presets.py each engine's way to generate; here what a user
sees before launch: validation and its fixes, the form's Rewards tab, the files, the rewards themselves (scored
as train_sft.py scores them) and the checks of your own reward file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tunedeck.backend import recipe
from tunedeck.backend.data.uploads import dataset_changes
from tunedeck.backend.recipe.vocabulary import REWARDS
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import SpecError, flat_values, resolve_spec, set_paths
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import section_shown, values_from_spec
from tunedeck.backend.validate import has_errors, validate

GRPO = {"objective": "grpo", "dataset.format": "prompt-only", "training.per_device_train_batch_size": 8}


def grpo_job(**changes):
    return set_paths(resolve_spec("7b-lora-ddp"), {**GRPO, **changes})


def problems_of(spec, field):
    return [p for p in validate(spec) if p.field == field]


def test_the_demo_preset_validates_and_its_files_ask_trl_for_grpo():
    spec = resolve_spec("demo-grpo")
    assert validate(spec) == []
    files = render_bundle(spec)
    args = yaml.safe_load(files["training_args.yaml"])
    assert (args["num_generations"], args["max_completion_length"], args["beta"]) == (8, 12, 0.0)
    assert "max_length" not in args and "dataset_num_proc" not in args  # GRPOConfig takes neither
    job = yaml.safe_load(files["job.yaml"])
    assert job["grpo"]["rewards"] == ["exact_answer", "close_answer"] and job["grpo"]["max_prompt_length"] == 64


def test_reward_weights_loss_and_scaling_reach_grpo_config(export, check):
    spec = resolve_spec(
        "demo-grpo",
        ["grpo.reward_weights=1, 0.25", "grpo.loss_type=dr_grpo", "grpo.scale_rewards=none",
         "grpo.mask_truncated_completions=true"],
    )  # fmt: skip
    config = check(export(spec)).sft_config  # TRL's own GRPOConfig, built from training_args.yaml
    assert type(config).__name__ == "GRPOConfig"
    assert (config.reward_weights, config.loss_type, config.scale_rewards) == ([1.0, 0.25], "dr_grpo", "none")
    assert config.mask_truncated_completions is True
    plain = yaml.safe_load(render_bundle(resolve_spec("demo-grpo"))["training_args.yaml"])
    assert plain["reward_weights"] is None and plain["loss_type"] == "dapo"  # TRL's defaults: 1 each, DAPO
    with pytest.raises(SpecError, match="3 weight.s. for 2 reward.s. .exact_answer, close_answer.: give one weight"):
        resolve_spec("demo-grpo", ["grpo.reward_weights=1, 0.5, 2"])


def test_a_step_must_write_whole_groups_of_answers():
    # 7b-lora-ddp: 4 processes x accumulation 4; a batch of 1 writes 16 answers a step: not groups of 12.
    spec = grpo_job(**{"training.per_device_train_batch_size": 1, "grpo.num_generations": 12})
    (problem,) = problems_of(spec, "grpo.num_generations")
    assert problem.level == "error" and "writes 16" in problem.message and "multiple of 12" in problem.message
    assert not has_errors(validate(set_paths(spec, problem.fix)))  # the fix: a batch of 12 per GPU
    assert problems_of(grpo_job(), "grpo.num_generations") == []
    evaluated = grpo_job(**{"dataset.eval_split": "test", "training.per_device_eval_batch_size": 1})
    (problem,) = problems_of(evaluated, "training.per_device_eval_batch_size")
    assert problem.fix == {"training.per_device_eval_batch_size": 8}


def test_prompts_and_grpo_go_together():
    (problem,) = problems_of(set_paths(resolve_spec("7b-lora-ddp"), {"objective": "grpo"}), "dataset.format")
    assert "prompt-only" in problem.message and problem.fix == {"dataset.format": "prompt-only"}
    (problem,) = problems_of(set_paths(resolve_spec("7b-lora-ddp"), {"dataset.format": "prompt-only"}), "objective")
    assert "GRPO" in problem.message and problem.fix == {"objective": "grpo"}


def test_a_low_temperature_is_warned_about():
    (problem,) = problems_of(grpo_job(**{"grpo.temperature": 0.1}), "grpo.temperature")
    assert problem.level == "warning" and "teach nothing" in problem.message


@pytest.mark.parametrize(
    "rewards, words",
    [
        ("exact", "is no reward"),
        ("rewards.py:score", "absolute path"),
        ("/x/rewards.py:9", "FILE.py:FUNCTION"),
        ("exact_answer, exact_answer", "named twice"),
        ("", "at least 1"),
    ],
)
def test_a_reward_that_is_none_is_refused_with_the_ways_to_name_one(rewards, words):
    with pytest.raises(SpecError) as caught:
        grpo_job(**{"grpo.rewards": rewards})
    assert "grpo.rewards" in str(caught.value) and words in str(caught.value)


def test_the_rewards_tab_and_fields_show_for_grpo_only():
    grpo, sft = values_from_spec(grpo_job()), values_from_spec(resolve_spec("7b-lora-ddp"))
    assert section_shown("Rewards", grpo) and not section_shown("Rewards", sft)
    assert applies("grpo.rewards", flat_values(grpo_job())) and not applies("dataset.max_seq_length", grpo)
    assert applies("dataset.answer_field", grpo) and not applies("preference.beta", grpo)


def test_train_sft_py_implements_exactly_the_rewards_tunedeck_offers():
    assert set(recipe.REWARD_FUNCTIONS) == set(REWARDS)
    # train.py ships alone, so it keeps its own copy of the spec's way to name your own reward: the same one
    from tunedeck.backend.spec.grpo import CUSTOM_REWARD

    assert recipe.CUSTOM_REWARD.pattern == CUSTOM_REWARD.pattern


@pytest.mark.parametrize(
    "completion, answer, exact, close",
    [
        (" 12", "12", 1.0, 1.0),
        (" 12.", "12", 1.0, 1.0),
        ("so 3 + 4 = 7 #### 7", "7", 1.0, 1.0),
        ("the answer is \\boxed{1,200}", "1200", 1.0, 1.0),
        (" 10", "12", 0.0, 1 / 3),
        (" ten", "12", 0.0, 0.0),
        (" c b a", "c b a", 1.0, 1.0),
        (" c a b", "c b a", 0.0, 1 / 3),
        ([{"role": "assistant", "content": "#### 5"}], "5", 1.0, 1.0),
    ],
)
def test_the_built_in_rewards_score_as_documented(completion, answer, exact, close):
    assert recipe.exact_answer([completion], answer=[answer]) == [exact]
    assert recipe.close_answer([completion], answer=[answer]) == [pytest.approx(close)]


def test_a_row_without_a_reference_answer_gets_no_score():
    assert recipe.exact_answer(["4", "5"], answer=["4", None]) == [1.0, None]


def _job(tmp_path: Path, rewards: list[str], rows: str = '{"prompt": "Q: 2+2\\nA:", "answer": "4"}\n') -> dict:
    data = tmp_path / "prompts.jsonl"
    data.write_text(rows, encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return {
        "model": {"name_or_path": str(model)},
        "objective": "grpo",
        "grpo": {"rewards": rewards},
        "dataset": {"path": str(data), "format": "prompt-only"},
    }


def test_your_own_reward_file_is_checked_before_launch(tmp_path):
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def brevity(completions, **kw):\n    return [-len(c) for c in completions]\n")
    assert recipe.input_problems(_job(tmp_path, [f"{rewards}:brevity"]), tmp_path) == []
    (problem,) = recipe.input_problems(_job(tmp_path, [f"{rewards}:length"]), tmp_path)
    assert problem[0] == "grpo.rewards" and "defines no function 'length' (it defines brevity)" in problem[1]
    (problem,) = recipe.input_problems(_job(tmp_path, [f"{tmp_path}/none.py:score"]), tmp_path)
    assert "cannot be read" in problem[1] and "machine that trains" in problem[1]
    rewards.write_text("def brevity(completions:\n")
    (problem,) = recipe.input_problems(_job(tmp_path, [f"{rewards}:brevity"]), tmp_path)
    assert "line 1" in problem[1] and "fix the reward file" in problem[1]
    (tmp_path / "ok.py").write_text("def short(completions, **kw):\n    return [1.0 for _ in completions]\n")
    (loaded,) = recipe.reward_functions({"grpo": {"rewards": [f"{tmp_path}/ok.py:short"]}})
    assert loaded(["a", "b"]) == [1.0, 1.0]  # train_sft.py hands TRL your function itself


def test_the_answer_rewards_need_the_answer_column(tmp_path):
    job = _job(tmp_path, ["exact_answer"], rows='{"prompt": "Q: 2+2\\nA:", "solution": "4"}\n')
    (problem,) = recipe.input_problems(job, tmp_path)
    assert problem[0] == "dataset.answer_field" and "no column 'answer'" in problem[1]
    job["dataset"]["answer_field"] = "solution"
    assert recipe.input_problems(job, tmp_path) == []
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def brevity(completions, **kw):\n    return [-len(c) for c in completions]\n")
    # your own reward alone may not need a reference answer: the column stays optional then
    assert recipe.input_problems(_job(tmp_path, [f"{rewards}:brevity"], rows='{"prompt": "Hi"}\n'), tmp_path) == []


def test_an_upload_of_prompts_sets_grpo_and_their_columns(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Q: 2+2\\nA:", "answer": "4"}\n', encoding="utf-8")
    changes, found, _ = dataset_changes(data, held_out=False, objective="sft")
    assert found == "prompt-only" and changes["objective"] == "grpo"
    assert (changes["dataset.prompt_field"], changes["dataset.answer_field"]) == ("prompt", "answer")
    data.write_text('{"prompt": "Q: 2+2\\nA:", "completion": " 4"}\n', encoding="utf-8")
    assert dataset_changes(data, held_out=False, objective="sft")[1] == "prompt-completion"
