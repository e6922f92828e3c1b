"""Validation rules of GRPO (objective=grpo): the groups of answers each step writes, and what they cost."""

from __future__ import annotations

from collections.abc import Iterator

from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem, error, warning


def answers_written_at_once(spec: JobSpec) -> int:
    """TRL's generation batch: every process writes per_device_train_batch_size answers for each micro-batch of
    the step (GRPOConfig's default steps_per_generation is the gradient accumulation), all before the step."""
    t = spec.training
    return t.per_device_train_batch_size * t.gradient_accumulation_steps * spec.launch.num_processes


def generation_groups(spec: JobSpec) -> Iterator[Problem]:
    """Each prompt's answers are scored against each other, so a generation batch holds whole groups only."""
    if spec.objective != "grpo":
        return
    group, t = spec.grpo.num_generations, spec.training
    written = answers_written_at_once(spec)
    if written % group:
        yield error(
            "grpo.num_generations",
            f"the {group} answers of a prompt are written together, but a step writes {written} "
            f"(training.per_device_train_batch_size {t.per_device_train_batch_size} x gradient accumulation "
            f"{t.gradient_accumulation_steps} x {spec.launch.num_processes} processes), not a multiple of {group}: "
            f"set training.per_device_train_batch_size={group}, or answers per prompt to a divisor of {written}.",
            {"training.per_device_train_batch_size": group},
        )
    if spec.dataset.eval_split and (t.per_device_eval_batch_size * spec.launch.num_processes) % group:
        yield error(
            "training.per_device_eval_batch_size",
            f"evaluation writes the {group} answers of a prompt together too: set training.per_device_eval_batch_size="
            f"{group} (or a multiple of {group} across the {spec.launch.num_processes} processes).",
            {"training.per_device_eval_batch_size": group},
        )
    if spec.grpo.temperature < 0.3:
        yield warning(
            "grpo.temperature",
            f"at temperature {spec.grpo.temperature:g} a prompt's answers are nearly the same, so they score the same "
            "and teach nothing (GRPO learns from their differences): 0.7-1.0 is usual.",
        )
