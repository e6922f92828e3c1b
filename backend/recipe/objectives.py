"""What each job.objective trains with: TRL's config and trainer classes, the forward passes it adds per token, and
what its trainer logs, as the log records name it. A new objective is a row in each table here.
"""

from __future__ import annotations

import os
import sys

from .job import JobError
from .rewards import unscored_warning

# Per trained token, the forward passes without gradients of an objective (TRL's trainers), by its reference and
# by the model itself, and the sequences of a row its token count covers: DPO's reference scores the chosen and
# the rejected answer (two sequences a row, both counted); KTO's reference scores the answer and a mismatched
# answer for the KL estimate, which the model scores too (the KL answers are not counted as tokens). GRPO's model
# writes its answers first, a forward a token (with the KV cache; the prompt once); a KL weight (grpo.beta > 0)
# adds a reference pass, counted by extra_forwards, not here: without one GRPO has no reference.
OBJECTIVE_PASSES = {"sft": (0, 0, 1), "dpo": (1, 0, 2), "kto": (2, 1, 1), "grpo": (0, 1, 1)}


# The objectives that always score against a reference (the base with the adapters off, or a frozen copy of it).
REFERENCE_OBJECTIVES = tuple(objective for objective, (reference, _, _) in OBJECTIVE_PASSES.items() if reference)


def extra_forwards(objective: str, precomputed: bool = False, kl_reference: bool = False) -> int:
    """Forward passes without gradients per trained token: the model's own, and the reference's unless its scores
    were computed once before training (preference.precompute_ref_log_probs); kl_reference: GRPO's KL reference."""
    reference, own, _ = OBJECTIVE_PASSES[objective]
    return own + (0 if precomputed else reference) + int(kl_reference)


def sequences_per_row(objective: str) -> int:
    return OBJECTIVE_PASSES[objective][2]


def _both_splits(pairs) -> dict:
    """{record key: logged key} of the training rows, and under eval_ of the held-out ones."""
    return {f"{prefix}{key}": f"{prefix}{logged}" for prefix in ("", "eval_") for key, logged in pairs}


# Log record key -> what DPOTrainer and KTOTrainer log (eval_ before both for the held-out rows): the implicit
# rewards beta * log(policy / reference) of the chosen (KTO: good) and rejected (bad) answers, their margin, how
# often chosen wins (DPO), and KTO's estimate of the KL divergence between the model and its reference.
PREFERENCE_LOGS = _both_splits(
    (
        ("reward_chosen", "rewards/chosen"),
        ("reward_rejected", "rewards/rejected"),
        ("reward_margin", "rewards/margins"),
        ("reward_accuracy", "rewards/accuracies"),
        ("kl", "kl"),
    )
)


# Log record key -> what GRPOTrainer logs: the mean and spread of the answers' summed rewards, their mean length
# in tokens, the share cut at grpo.max_completion_length, and the share of prompts whose answers all scored the
# same (nothing to learn from them).
GRPO_LOGS = _both_splits(
    (
        ("reward", "reward"),
        ("reward_std", "reward_std"),
        ("completion_length", "completions/mean_length"),
        ("completions_clipped", "completions/clipped_ratio"),
        ("groups_without_signal", "frac_reward_zero_std"),
    )
)


def grpo_record(logs: dict) -> dict:
    """GRPO's keys of a log record: GRPO_LOGS, and each reward's mean under "rewards" ("eval_rewards")."""
    record = {key: logs[logged] for key, logged in GRPO_LOGS.items() if logged in logs}
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


# What each job.objective trains with: TRL's config and trainer classes.
OBJECTIVES = {
    "sft": ("SFTConfig", "SFTTrainer"),
    "dpo": ("DPOConfig", "DPOTrainer"),
    "kto": ("KTOConfig", "KTOTrainer"),
    "grpo": ("GRPOConfig", "GRPOTrainer"),
}


def objective_classes(job: dict) -> tuple[type, type]:
    """(config class, trainer class) of the job's objective: SFT on demonstrations, DPO on preference pairs, KTO on
    answers labelled good or bad."""
    import trl

    objective = job.get("objective") or "sft"
    if objective not in OBJECTIVES:
        raise JobError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    config, trainer = OBJECTIVES[objective]
    return getattr(trl, config), getattr(trl, trainer)


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
