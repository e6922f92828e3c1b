"""The job spec's training.health section: what the run does when its loss or gradient norm goes wrong.

The thresholds follow published practice (each field says whose): MosaicML's LLM Foundry
(KillLossSpike: a loss above 2x its running mean for 4 logged steps), Megatron-LM (a NaN check
on loss and gradients; a value 10x its recent history is "unexpectedly large") and PaLM
(arXiv:2204.02311, 5.1: restart from a checkpoint before the spike and skip the data batches that
preceded it). The recipe's guard (backend/recipe/health.py) reads them from job.yaml.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tunedeck.backend.spec.sections import SpecSection

HealthPolicy = Literal["off", "warn", "stop", "rollback"]


class HealthSpec(SpecSection):
    policy: HealthPolicy = Field(
        default="warn",
        title="When training goes wrong",
        description="What the run does when the loss or gradient norm goes NaN/Inf, the loss hits exactly 0 with "
        "a NaN or zero gradient norm, or either spikes: warn marks the run unhealthy and trains on; stop ends it "
        "as failed, keeping the checkpoints from before; rollback resumes from the newest checkpoint before the "
        "first bad step with a lower learning rate, skipping the data that came before the blow-up; off checks "
        "nothing.",
    )
    grad_norm_factor: float = Field(
        default=10.0,
        ge=1.5,
        le=1e6,
        title="Grad-norm spike (x median)",
        description="A gradient norm above this many times its running median is a spike (Megatron-LM calls a "
        "value 10x its recent history unexpectedly large).",
    )
    loss_factor: float = Field(
        default=2.0,
        gt=1,
        le=1e6,
        title="Loss spike (x mean)",
        description="A loss above this many times its running mean is a spike (LLM Foundry's KillLossSpike: 2).",
    )
    patience: int = Field(
        default=4,
        ge=1,
        le=1000,
        title="Spike lasts (logs)",
        description="A spike counts once it lasts this many logged steps in a row (LLM Foundry: 4); NaN, Inf and "
        "a zero loss with a broken gradient count at once.",
    )
    window: int = Field(
        default=20,
        ge=3,
        le=10_000,
        title="Running window (logs)",
        description="How many healthy logged steps the running median and mean cover; spikes are looked for once "
        "3 have been logged.",
    )
    lr_scale: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        title="LR after a roll-back (x)",
        description="Each roll-back multiplies the learning rate by this (twice: 0.25x).",
    )
    max_rollbacks: int = Field(
        default=2,
        ge=1,
        le=100,
        title="Roll-backs at most",
        description="After this many roll-backs the next blow-up stops the run as failed.",
    )
