"""The job spec's GRPO section (objective=grpo): how many answers the model writes per prompt, how long, and what
scores them. The numeric fields are TRL GRPOConfig arguments of the same names; the rewards are train.py's.

GRPO (TRL's GRPOTrainer) learns online: for each prompt the model writes num_generations answers, the rewards
score each, and an answer better than its group's mean is made more likely, one worse less (no value model,
no preference data: the rewards are the teacher).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from tunedeck.backend.recipe.vocabulary import REWARDS
from tunedeck.backend.spec.sections import BASIC, SftField, SpecSection

# Your own reward: a Python file and the function in it, FILE.py:NAME (the file an absolute path, read where the job
# trains). The function gets (prompts, completions, **columns) as TRL passes it and returns one float per completion.
CUSTOM_REWARD = re.compile(r"^(?P<file>/.+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")


def reward_problem(entry: str) -> str | None:
    """Why a grpo.rewards entry is not a reward, or None."""
    if entry in REWARDS or CUSTOM_REWARD.match(entry):
        return None
    if ":" in entry or entry.endswith(".py"):
        return (
            f"{entry!r}: your own reward is FILE.py:FUNCTION with FILE an absolute path, e.g. /home/me/rewards.py:score"
        )
    return f"{entry!r} is no reward: use {' or '.join(REWARDS)}, or your own function as /path/to/FILE.py:FUNCTION"


class GrpoSpec(SpecSection):
    num_generations: int = SftField(
        8,
        ge=2,
        le=256,
        basic=True,
        title="Answers per prompt",
        description="Answers the model writes for each prompt; each is scored against its group's mean. 8-16 is "
        "usual. The answers written at once (batch per GPU x gradient accumulation x processes) must be a multiple.",
    )
    max_completion_length: int = SftField(
        256,
        ge=1,
        le=131_072,
        basic=True,
        title="Answer length",
        description="Most tokens the model writes per answer; a longer answer is cut there. Memory and time grow "
        "with it.",
    )
    max_prompt_length: int = Field(
        default=512,
        ge=8,
        le=1_048_576,
        title="Prompt length",
        description="Longest prompt in tokens (as the model sees it, chat template included); longer prompts are left "
        "out, and the run says how many. The memory estimate counts on it.",
    )
    temperature: float = SftField(
        1.0,
        gt=0,
        le=10,
        title="Sampling temperature",
        description="Temperature of the answers' sampling: lower writes the likeliest answers (less to learn from "
        "when they agree), higher explores. 0.7-1.0 is usual.",
    )
    beta: float = SftField(
        0.0,
        ge=0,
        le=100,
        title="KL weight",
        description="How strongly the model is held near its start (the base; with adapters, the base with the "
        "adapters off). 0, TRL's default, needs no reference model; 0.01-0.04 adds one (memory and a forward pass).",
    )
    rewards: Annotated[list[str], Field(min_length=1, max_length=16)] = Field(
        default=["exact_answer"],
        title="Rewards",
        json_schema_extra=BASIC,
        description="What scores each answer (summed): exact_answer (the reference answer exactly), close_answer "
        "(partial credit), or your own function as /path/to/FILE.py:FUNCTION. Comma-separated.",
    )

    reward_weights: Annotated[list[float], Field(max_length=16)] | None = SftField(
        None,
        title="Reward weights",
        description="Each reward's weight in the sum, in the order of grpo.rewards, comma-separated (e.g. 1, 0.5); "
        "empty: 1 each.",
    )
    loss_type: Literal["dapo", "dr_grpo", "grpo", "bnpo", "cispo", "sapo"] = SftField(
        "dapo",
        title="Loss",
        description="How token losses add up: dapo (TRL's default: over the tokens of the whole accumulated batch, "
        "no length bias), dr_grpo (over a constant, max_completion_length), grpo (per answer: favours short right "
        "answers), bnpo (over the local batch's tokens), cispo (clips the importance weights), sapo (a soft gate "
        "instead of clipping).",
    )
    scale_rewards: Literal["group", "batch", "none"] = SftField(
        "group",
        title="Reward scaling",
        description="Divide each answer's advantage by the spread of its group's rewards (group, GRPO's), of the "
        "whole batch's (batch), or not at all (none: Dr. GRPO's advice, no bias toward easy or hard prompts).",
    )
    mask_truncated_completions: bool = SftField(
        False,
        title="Leave cut answers out",
        description="Answers cut at max_completion_length do not count in the loss (DAPO's advice: a cut answer is "
        "not a wrong one).",
    )

    @field_validator("rewards", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        # Forms and --set give "exact_answer, close_answer" (an empty box: none); the job keeps a list.
        if value is None:
            return []
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("rewards")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        problems = [problem for entry in value if (problem := reward_problem(entry))]
        if problems:
            raise ValueError("; ".join(problems))
        if len(set(value)) != len(value):
            raise ValueError("a reward is named twice: name each once")
        return value

    @field_validator("reward_weights", mode="before")
    @classmethod
    def _weights_from_text(cls, value: Any) -> Any:
        # Forms and --set give "1, 0.5"; an empty box: 1 each.
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()] or None
        return value

    @field_validator("reward_weights")
    @classmethod
    def _one_weight_a_reward(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        rewards = info.data.get("rewards")
        if value is not None and rewards is not None and len(value) != len(rewards):
            raise ValueError(
                f"{len(value)} weight(s) for {len(rewards)} reward(s) ({', '.join(rewards)}): give one weight per "
                "reward, in their order, or leave it empty for 1 each"
            )
        return value
