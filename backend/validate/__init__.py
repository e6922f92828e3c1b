"""Rules across fields: a list of problems, each naming the field and saying the fix.

spec.py checks what one field alone can check (types, ranges, choices). Here are the
combinations that the libraries reject late (after minutes of model loading), reject
with an unhelpful message, or, worse, accept while silently doing something else
(see docs/notes/cpu-distributed.md). Errors block export and launch; warnings are advice
from the seed guides and the libraries' documentation.

The rules live by area: validate_method.py (what is trained), validate_strategy.py (how the
work is split), validate_sequence.py (sequence parallelism), validate_launch.py (where it runs),
validate_speed.py (the speed switches). One more rule comes from the
applicability table (backend/spec/applies.py): a field set to other than its default where it
does not apply is ignored, and the job says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set

from tunedeck.backend.spec import JobSpec, field_info, flat_values
from tunedeck.backend.spec.applies import applies, when
from tunedeck.backend.spec.problem import Problem, has_errors, spelled, warning
from tunedeck.backend.validate import grpo as validate_grpo
from tunedeck.backend.validate import launch as validate_launch
from tunedeck.backend.validate import method as validate_method
from tunedeck.backend.validate import sequence as validate_sequence
from tunedeck.backend.validate import speed as validate_speed
from tunedeck.backend.validate import strategy as validate_strategy

# CPU_RANK_BYTES: what one CPU rank costs in RAM, read by tests that size a machine.
from tunedeck.backend.validate.launch import CPU_RANK_BYTES

Rule = Callable[[JobSpec], Iterator[Problem]]

RULES: list[Rule] = [
    validate_method.method_and_quantization,
    validate_method.objective_and_format,
    validate_method.kto_batch,
    validate_method.precomputed_reference,
    validate_grpo.generation_groups,
    validate_method.lora,
    validate_method.precision,
    validate_strategy.offload,
    validate_strategy.fsdp,
    validate_strategy.adapter_strategy,
    validate_sequence.sequence_parallel,
    validate_launch.cpu,
    validate_launch.cpu_processes,
    validate_launch.launch,
    validate_launch.slurm_environment,
    validate_launch.skypilot,
    validate_method.training,
    validate_speed.speed,
]


def validate(spec: JobSpec) -> list[Problem]:
    """Every problem of the spec, errors first, in the order of the rules, then the ignored settings."""
    problems = [problem for rule in RULES for problem in rule(spec)]
    problems += ignored_settings(spec, named={p.field for p in problems})
    return sorted(problems, key=lambda p: p.level != "error")


def ignored_settings(spec: JobSpec, named: Set[str] = frozenset()) -> list[Problem]:
    """A warning for each field that differs from its default where it does not apply (unless a rule
    already named that field, with more to say)."""
    values = flat_values(spec)
    out = []
    for path, value in values.items():
        info = field_info(path)  # every path of flat_values is a field
        default = info.get_default(call_default_factory=True) if info else None
        if path in named or value == default or applies(path, values):
            continue
        rule = when(path)
        job = ", ".join(f"{key}={spelled(values[key])}" for key in rule.reads)
        fix = "clear it" if default is None else f"set it back to {spelled(default)}"
        out.append(
            warning(path, f"ignored: it applies only {rule.says}, and this job has {job}: {fix}.", {path: default})
        )
    return out


def describe_global_batch(spec: JobSpec) -> str:
    return f"global batch {spec.global_batch_size} = {global_batch_terms(spec)}"


def global_batch_terms(spec: JobSpec) -> str:
    """What the global batch multiplies: "2 per device x 4 processes x 8 accumulation steps"."""
    t = spec.training
    return (
        f"{t.per_device_train_batch_size} per device x {spec.data_parallel_size} {_readers(spec)} "
        f"x {t.gradient_accumulation_steps} accumulation steps"
    )


def _readers(spec: JobSpec) -> str:
    """Who reads their own rows: every process, or each group of GPUs sharing a sequence."""
    n = spec.sequence_parallel
    if n == 1:
        return "processes"
    groups = "group" if spec.data_parallel_size == 1 else "groups"
    return f"sequence {groups} ({spec.launch.num_processes} processes, {n} GPUs per sequence)"


__all__ = [
    "CPU_RANK_BYTES",
    "RULES",
    "Problem",
    "describe_global_batch",
    "global_batch_terms",
    "has_errors",
    "ignored_settings",
    "validate",
]
