"""The training-health guard: a loss or gradient norm gone NaN, to exactly 0 or spiking, seen at each logging step,
and what the run then does (job.yaml's training.health: warn, stop or rollback).

Every rank sees the same logged loss and gradient norm (the Trainer gathers the loss before logging it), so every
rank's guard reaches the same verdict; the recorder still makes them agree before a rank stops. A roll-back ends
the attempt: rank 0 writes rollback.json (the checkpoint before the first bad step, the steps of data to skip, the
learning rate's new scale) and tunedeck's supervisor starts the run again in its folder with TUNEDECK_ROLLBACK
naming that file; the new attempt loads the checkpoint, scales the learning rate and skips the data window that
preceded the blow-up, as PaLM did by hand (arXiv:2204.02311, 5.1).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

MIN_HISTORY = 3  # healthy logged steps before a spike can be told from the start of training

# Likely causes seen in practice, said as hints (the symptom is measured; the cause is not).
HINT_FP16 = "fp16 overflows where bf16 does not: use training.precision=bf16 on a GPU that has it (Ampere or newer)"
HINT_LR = "a learning rate too high for this model or batch: try half (training.learning_rate)"
HINT_ZERO2 = (
    "DeepSpeed ZeRO-1/2 with overlap_comm gave NaN gradient norms and a zero loss before DeepSpeed 0.19.0 "
    "(deepspeed#5347, fixed by #7965): check the version, or try strategy.overlap_comm=false"
)
HINT_FLASH = (
    "flash attention on some models (Gemma's soft-capped attention among them) gives a zero or NaN loss: try "
    "model.attn_implementation=sdpa or eager"
)
HINT_DATA = "a bad batch (an empty answer, a very long or garbled row): the roll-back skips the data before it"


class Unhealthy(Exception):
    """Raised on every rank when the guard stops the run or rolls it back: main() records how it ended."""

    def __init__(self, symptom: Symptom, action: str, message: str):
        super().__init__(message)
        self.symptom, self.action = symptom, action


@dataclass
class Symptom:
    text: str  # "grad norm NaN"
    step: int  # the logged step that showed it first
    last_good_step: int  # the logged step before: a checkpoint at or before it predates the blow-up
    hints: list[str] = field(default_factory=list)
    lasted: int = 1  # logged steps in a row

    @property
    def line(self) -> str:
        lasted = f", for {self.lasted} logged steps" if self.lasted > 1 else ""
        return f"⚠ unhealthy: {self.text} at step {self.step}{lasted}"


def settings_of(job: dict) -> dict:
    """job.yaml's training.health, with the spec's defaults for what a hand-written job leaves out."""
    given = (job.get("training") or {}).get("health") or {}
    defaults = {"policy": "warn", "grad_norm_factor": 10.0, "loss_factor": 2.0, "patience": 4, "window": 20}
    return {**defaults, "lr_scale": 0.5, "max_rollbacks": 2, **given}


def _bad(value) -> bool:
    return isinstance(value, (int, float)) and not math.isfinite(value)


def _shown(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Inf" if value > 0 else "-Inf")


class HealthGuard:
    """Reads each logged (step, loss, grad norm); returns a Symptom once one is confirmed."""

    def __init__(self, job: dict, first_step: int = 0):
        self.settings = settings_of(job)
        self.policy = str(self.settings["policy"])
        self.objective = job.get("objective") or "sft"
        self.hint_context = job
        window = int(self.settings["window"])
        self.losses: deque[float] = deque(maxlen=window)
        self.norms: deque[float] = deque(maxlen=window)
        self.last_good = first_step
        self.streak: list[tuple[int, str]] = []  # (step, what) of the spikes in a row not yet confirmed
        self.reported = False  # this episode was reported: say it again only after a healthy step

    @property
    def suspect(self) -> bool:
        """A spike is under way or confirmed: no checkpoint may be saved from this state."""
        return bool(self.streak) or self.reported

    def last_symptom(self, step: int) -> Symptom:
        """What this rank saw when another rank's guard ended the run (ranks agree; this is the fallback)."""
        first, what = self.streak[0] if self.streak else (step, "another rank's guard")
        return Symptom(what, first, self.last_good)

    def check(self, step: int, loss: float | None, grad_norm: float | None) -> Symptom | None:
        if self.policy == "off" or loss is None:
            return None
        at_once = self._broken(loss, grad_norm)
        spike = None if at_once else self._spike(loss, grad_norm)
        if not at_once and not spike:
            self.streak, self.reported = [], False
            self.losses.append(loss)
            if grad_norm is not None:
                self.norms.append(grad_norm)
            self.last_good = step
            return None
        if at_once:
            self.streak.append((step, at_once))
        else:
            self.streak.append((step, spike or ""))
            if len(self.streak) < int(self.settings["patience"]):
                return None
        if self.reported:
            return None
        self.reported = True
        first_step, what = self.streak[0]
        return Symptom(what, first_step, self.last_good, self.hints(what), len(self.streak))

    def _broken(self, loss: float, grad_norm: float | None) -> str | None:
        """NaN or Inf in either, or a loss of exactly 0 with a NaN or zero gradient norm: no patience for these."""
        if _bad(loss):
            return f"loss {_shown(loss)}"
        if grad_norm is not None and _bad(grad_norm):
            return f"grad norm {_shown(grad_norm)}"
        # GRPO's loss is 0 whenever a group's answers score alike (its gradient norm then too): not a symptom there.
        if loss == 0 and grad_norm is not None and grad_norm == 0 and self.objective != "grpo":
            return "loss exactly 0 with a zero grad norm"
        return None

    def _spike(self, loss: float, grad_norm: float | None) -> str | None:
        factor = float(self.settings["grad_norm_factor"])
        if grad_norm is not None and len(self.norms) >= MIN_HISTORY:
            median = statistics.median(self.norms)
            if median > 0 and grad_norm > factor * median:
                return f"grad norm {grad_norm:.3g} > {factor:g}x its running median {median:.3g}"
        # GRPO's loss sits near 0 and changes sign: its spikes are the gradient norm's.
        if self.objective != "grpo" and len(self.losses) >= MIN_HISTORY:
            mean = statistics.fmean(self.losses)
            factor = float(self.settings["loss_factor"])
            if mean > 0 and loss > factor * mean:
                return f"loss {loss:.4g} > {factor:g}x its running mean {mean:.4g}"
        return None

    def hints(self, what: str) -> list[str]:
        job = self.hint_context
        training, strategy, model = (job.get(key) or {} for key in ("training", "strategy", "model"))
        hints = []
        if training.get("precision") == "fp16" and ("NaN" in what or "Inf" in what):
            hints.append(HINT_FP16)
        if strategy.get("kind") in ("zero1", "zero2") and strategy.get("overlap_comm", True):
            hints.append(HINT_ZERO2)
        if "flash" in str(model.get("attn_implementation") or "") and ("0" in what or "NaN" in what):
            hints.append(HINT_FLASH)
        hints.append(HINT_LR)
        if "spike" in what or ">" in what:
            hints.append(HINT_DATA)
        return hints
