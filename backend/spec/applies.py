"""When a field applies: one table that hides a field in the form and warns when it is set but ignored.

A field with no rule here always applies. The rules read the strategy and dataset-format
tables (backend/recipe/vocabulary.py), so a new strategy kind or format gets its fields' rules from
its row. Like H2O LLM Studio's declared dependencies: the form (backend/spec/fields.py) hides what
does not apply; validation (backend/validate_rules.py, `ignored_settings`) warns about a
value that differs from the default where it does not apply; training_args.yaml copies an
SFTConfig argument only where it applies (backend/render/training_args.py).

Values are the flat {dotted path: value} of a job (spec_parse.flat_values), as the form holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from tunedeck.backend.recipe.objectives_table import OBJECTIVES, knob_readers, objectives_said
from tunedeck.backend.recipe.vocabulary import STRATEGIES, Strategy, column_fields

Values = dict[str, Any]


@dataclass(frozen=True)
class When:
    reads: tuple[str, ...]  # the fields the test reads
    test: Callable[[Values], bool]
    says: str  # ends "applies only ...", e.g. "with method=lora or qlora"


def _kinds(pick: Callable[[Strategy], bool]) -> When:
    kinds = [kind for kind, strategy in STRATEGIES.items() if pick(strategy)]
    says = f"with strategy.kind={' or '.join(kinds)}"
    return When(("strategy.kind",), lambda v: v.get("strategy.kind") in kinds, says)


def _formats(formats: list[str]) -> When:
    return When(
        ("dataset.format",), lambda v: v.get("dataset.format") in formats, f"with dataset.format={' or '.join(formats)}"
    )


_ALWAYS = When((), lambda v: True, "always")
_ADAPTERS = When(("method",), lambda v: v.get("method") in ("lora", "qlora"), "with method=lora or qlora")
_FOUR_BIT = When(("quantization.bits",), lambda v: v.get("quantization.bits") == 4, "with quantization.bits=4")
_EVALUATION = When(
    ("dataset.eval_split",),
    lambda v: bool(v.get("dataset.eval_split")),
    "with an evaluation split (dataset.eval_split)",
)
_MACHINES = When(
    ("launch.num_machines",),
    lambda v: (v.get("launch.num_machines") or 1) > 1,
    "with several machines (launch.num_machines > 1)",
)
_MACHINES_BY_HAND = When(
    ("launch.num_machines", "launch.backend"),
    lambda v: (v.get("launch.num_machines") or 1) > 1 and v.get("launch.backend", "local") == "local",
    "with several machines started by hand (launch.num_machines > 1, launch.backend=local; Slurm picks them)",
)
_SLURM = When(("launch.backend",), lambda v: v.get("launch.backend") == "slurm", "with launch.backend=slurm")
_SKYPILOT = When(("launch.backend",), lambda v: v.get("launch.backend") == "skypilot", "with launch.backend=skypilot")
_SKYPILOT_GPUS = When(
    ("launch.backend", "launch.use_cpu"),
    lambda v: v.get("launch.backend") == "skypilot" and not v.get("launch.use_cpu"),
    "with launch.backend=skypilot on GPUs (launch.use_cpu=false)",
)
_STALL_WATCHED = When(
    ("launch.stall_minutes",), lambda v: (v.get("launch.stall_minutes") or 0) > 0, "with launch.stall_minutes > 0"
)
_HEALTH_WATCHED = When(
    ("training.health.policy",),
    lambda v: v.get("training.health.policy", "warn") != "off",
    "with training.health.policy other than off",
)
_ROLLBACK = When(
    ("training.health.policy",),
    lambda v: v.get("training.health.policy") == "rollback",
    "with training.health.policy=rollback",
)
_SLURM_GPUS = When(
    ("launch.backend", "launch.use_cpu"),
    lambda v: v.get("launch.backend") == "slurm" and not v.get("launch.use_cpu"),
    "with launch.backend=slurm on GPUs (launch.use_cpu=false)",
)
_CONTAINER = When(
    ("launch.backend", "launch.slurm.container.image"),
    lambda v: v.get("launch.backend") == "slurm" and bool(v.get("launch.slurm.container.image")),
    "with a container image (launch.backend=slurm, launch.slurm.container.image set)",
)
_GPUS = When(("launch.use_cpu",), lambda v: not v.get("launch.use_cpu"), "on GPUs (launch.use_cpu=false)")
_SFT = When(("objective",), lambda v: v.get("objective", "sft") == "sft", "with objective=sft")


def _objectives(names: list[str]) -> When:
    return When(
        ("objective",), lambda v: v.get("objective", "sft") in names, f"with objective={objectives_said(names)}"
    )


# GRPOConfig has no max_length (the prompts' limit is grpo.max_prompt_length, the answers' max_completion_length)
_NOT_GRPO = _objectives([name for name in OBJECTIVES if name != "grpo"])
_SFT_NOT_PACKING = When(
    ("objective", "dataset.packing"),
    lambda v: v.get("objective", "sft") == "sft" and not v.get("dataset.packing"),
    "with objective=sft and dataset.packing=false",
)
# The general-text loss is measured in the evaluation loop, with SFT's collator; not on a sequence split by Ulysses.
_GENERAL_TEXT = When(
    ("objective", "dataset.eval_split", "strategy.sequence_parallel"),
    lambda v: (
        v.get("objective", "sft") == "sft"
        and bool(v.get("dataset.eval_split"))
        and (v.get("strategy.sequence_parallel") or 1) == 1
    ),
    "with objective=sft, an evaluation split (dataset.eval_split) and strategy.sequence_parallel=1",
)
_NVME = When(
    ("strategy.offload_optimizer", "strategy.offload_params"),
    lambda v: "nvme" in (v.get("strategy.offload_optimizer"), v.get("strategy.offload_params")),
    "with NVMe offload (strategy.offload_optimizer or strategy.offload_params = nvme)",
)

# (glob over dotted paths, When). The first matching rule decides.
APPLIES_WHEN: list[tuple[str, When]] = [
    ("lora.*", _ADAPTERS),
    ("quantization.bits", _ADAPTERS),
    ("quantization.bnb_4bit_*", _FOUR_BIT),
    *[(f"dataset.{name}", _formats(formats)) for name, (_, formats) in column_fields().items()],
    ("dataset.assistant_only_loss", _formats(["messages"])),
    ("dataset.packing", _SFT),  # DPO pads each pair (TRL's padding-free DPO needs flash attention)
    # KTO's KL estimate pairs each row with its neighbour in a fixed order (KTOConfig: sequential sampling)
    ("training.group_by_length", _SFT_NOT_PACKING),
    ("training.neftune_noise_alpha", _SFT),
    # Each objective's knobs, with the objectives that read them (backend/recipe/objectives_table.py).
    *[(knob, _objectives(names)) for knob, names in knob_readers().items()],
    ("dataset.max_seq_length", _NOT_GRPO),
    ("training.dataloader_num_workers", _GPUS),
    ("training.per_device_eval_batch_size", _EVALUATION),
    ("training.eval_steps", _EVALUATION),
    ("dataset.general_text", _GENERAL_TEXT),
    ("training.ddp_find_unused_parameters", _kinds(lambda s: s.is_ddp)),
    ("strategy.kind", _ALWAYS),
    ("strategy.offload_optimizer", _kinds(lambda s: bool(s.offload_optimizer))),
    ("strategy.offload_params", _kinds(lambda s: bool(s.offload_params))),
    ("strategy.nvme_path", _NVME),
    ("strategy.allgather_bucket_size", _kinds(lambda s: s.is_deepspeed and not s.shards_parameters)),
    ("strategy.stage3_*", _kinds(lambda s: s.is_deepspeed and s.shards_parameters)),
    ("strategy.fsdp_*", _kinds(lambda s: s.is_fsdp)),
    ("strategy.*", _kinds(lambda s: s.is_deepspeed)),  # the remaining DeepSpeed knobs
    ("launch.gpu_ids", _GPUS),
    ("launch.machine_rank", _MACHINES_BY_HAND),
    ("launch.main_process_ip", _MACHINES_BY_HAND),
    ("launch.main_process_port", _MACHINES),
    ("launch.rdzv_backend", _MACHINES),
    ("launch.same_network", _MACHINES),
    ("launch.stop_when_stalled", _STALL_WATCHED),
    ("training.health.policy", _ALWAYS),
    ("training.health.lr_scale", _ROLLBACK),
    ("training.health.max_rollbacks", _ROLLBACK),
    ("training.health.*", _HEALTH_WATCHED),
    ("launch.slurm.gpus_per_node", _SLURM_GPUS),
    ("launch.slurm.container.runtime", _CONTAINER),
    ("launch.slurm.container.mounts", _CONTAINER),
    ("launch.slurm.*", _SLURM),
    ("launch.skypilot.accelerators", _SKYPILOT_GPUS),
    ("launch.skypilot.*", _SKYPILOT),
]


def when(path: str) -> When:
    """The rule that decides whether a field applies."""
    return next((rule for pattern, rule in APPLIES_WHEN if fnmatchcase(path, pattern)), _ALWAYS)


def applies(path: str, values: Values) -> bool:
    """Does this field matter for the job described by `values`?"""
    return bool(when(path).test(values))
