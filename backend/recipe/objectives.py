"""What each job.objective trains with: TRL's config and trainer classes, the forward passes it adds per token, and
what its trainer logs, as the log records name it, all read from its row of the Objective table
(objectives_table.py): a new objective is a row there. What is GRPO's own (each reward's mean, the reward warning)
is here too.
"""

from __future__ import annotations

import importlib
import os
import sys

from .job import JobError
from .objectives_table import OBJECTIVES as TABLE
from .objectives_table import REFERENCE_OBJECTIVES as REFERENCE_OBJECTIVES  # the objectives that score a reference
from .rewards import unscored_warning

# Per trained token, the forward passes without gradients of an objective, by its reference and by the model
# itself, and the sequences of a row its token count covers (objectives_table.py says why for each).
OBJECTIVE_PASSES = {name: (o.reference_passes, o.own_passes, o.sequences_per_row) for name, o in TABLE.items()}


def extra_forwards(objective: str, precomputed: bool = False, kl_reference: bool = False) -> int:
    """Forward passes without gradients per trained token: the model's own, and the reference's unless its scores
    were computed once before training (preference.precompute_ref_log_probs); kl_reference: GRPO's KL reference."""
    reference, own, _ = OBJECTIVE_PASSES[objective]
    return own + (0 if precomputed else reference) + int(kl_reference)


def sequences_per_row(objective: str) -> int:
    return OBJECTIVE_PASSES[objective][2]


def objective_record(objective: str | None, logs: dict) -> dict:
    """The objective's keys of a log record (its row's record keys: rewards, KL, ORPO's odds ratio, GRPO's answers),
    of the training rows and (eval_) the held-out ones, from what its trainer logged."""
    keys = TABLE[objective or "sft"].record_keys
    return {key: logs[logged] for key, logged in keys.items() if logged in logs}


def grpo_record(logs: dict) -> dict:
    """GRPO's own keys of a log record: each reward's mean under "rewards" ("eval_rewards")."""
    record = {}
    for prefix in ("", "eval_"):
        start, end = f"{prefix}rewards/", "/mean"
        rewards = {
            name[len(start) : -len(end)]: value
            for name, value in logs.items()
            if name.startswith(start) and name.endswith(end)
        }
        if rewards:
            record[f"{prefix}rewards"] = rewards
    return record


def objective_classes(job: dict) -> tuple[type, type]:
    """(config class, trainer class) of the job's objective, from TRL's module of its row (TRL 1.16 keeps ORPO's and
    CPO's, SimPO's, in trl.experimental)."""
    objective = job.get("objective") or "sft"
    if objective not in TABLE:
        raise JobError(f"objective: {objective!r} is not one of {', '.join(TABLE)}")
    row = TABLE[objective]
    module = importlib.import_module(row.trl_module)
    return getattr(module, row.config), getattr(module, row.trainer)


def trainer_class(base):
    """The objective's TRL trainer, which also runs FSDP2 on CPU ranks (over gloo) when the launcher asked for FSDP2.

    DPOTrainer and KTOTrainer with adapters need no reference model: they score the reference with the adapters off.
    GRPOTrainer's rewards of each step are looked at whole: a reward that scored none of them is a warning
    (reward_warning, which rank 0's progress.json carries to the run's state line, and its log).
    """

    class Trainer(base):
        reward_warning: str | None = None

        def _calculate_rewards(self, *args, **kwargs):  # GRPOTrainer's (TRL 1.x): every rank's rewards, gathered
            rewards = super()._calculate_rewards(*args, **kwargs)
            if not self.model.training:  # an evaluation trains nothing either way
                return rewards
            warning = unscored_warning(self.reward_func_names, rewards, self.state.global_step + 1)
            if warning and self.is_world_process_zero():
                self.reward_warning = warning
                print(f"warning: {warning}", file=sys.stderr, flush=True)
            return rewards

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            if _switch_cpu_ranks_to_fsdp2(self.accelerator):
                self.is_fsdp_enabled = True
                if self.accelerator.state.fsdp_plugin.activation_checkpointing and self.args.activation_checkpointing:
                    raise JobError(
                        "training.gradient_checkpointing: FSDP's activation checkpointing is on as well; "
                        "set training.gradient_checkpointing=false and keep strategy.fsdp_activation_checkpointing"
                    )

    return Trainer


def fsdp_launch() -> bool:
    """Whether the launcher asked for FSDP (accelerate exports its config to the ranks' environment)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def _switch_cpu_ranks_to_fsdp2(accelerator) -> bool:
    """Run accelerate's own FSDP2 path (fsdp2_prepare_model: fully_shard per layer) on CPU ranks.

    accelerate 1.15 takes its FSDP branch only for GPU-like distributed types (AcceleratorState in
    accelerate/state.py): on CPU ranks an FSDP launch silently becomes DDP (measured). PyTorch's
    FSDP2 itself runs over gloo, FSDP1 does not ("FSDP needs a non-CPU accelerator device"). So
    when the launcher exported an FSDP2 config (ACCELERATE_USE_FSDP, FSDP_VERSION=2) and the
    ranks are CPU processes, hand accelerate the plugin it would have built from the same
    environment and mark the shared state as FSDP; prepare() then shards with fully_shard.
    Returns True when it switched. The sanity gate checks what the model really got.
    """
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    fsdp2 = fsdp_launch() and os.environ.get("FSDP_VERSION") == "2"
    if state.distributed_type != DistributedType.MULTI_CPU or not fsdp2:
        return False
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* environment, as accelerate builds it
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    # What AcceleratorState itself sets for FSDP; its state is shared, so Accelerator and Trainer see it.
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True
