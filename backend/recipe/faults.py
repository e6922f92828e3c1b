"""TUNEDECK_FAULT's loss faults, for the tests of the training-health guard: "nan=30" makes step 30's loss NaN
(its gradients, then the weights, follow as in a real blow-up); "spike=30" multiplies the loss by SPIKE_FACTOR from
step 30 on. Both act in the first attempt only: an attempt after a roll-back (TUNEDECK_ROLLBACK) trains clean, as
a run whose bad data window was skipped would. The other faults (a rank failing, exiting, a slow phase) are
records.py's. Unset in normal use.
"""

from __future__ import annotations

import os

from .records import FAULT_ENV, _fault_parts
from .rollback import ROLLBACK_ENV

SPIKE_FACTOR = 50.0


def loss_fault(text: str | None) -> tuple[str, int] | None:
    """("nan" | "spike", step) when TUNEDECK_FAULT names one (and this is not an attempt after a roll-back)."""
    if os.environ.get(ROLLBACK_ENV):
        return None
    parts = _fault_parts(text)
    kind = next((name for name in ("nan", "spike") if name in parts), None)
    return (kind, int(parts[kind])) if kind else None


def with_loss_fault(trainer_class):
    """trainer_class, whose loss TUNEDECK_FAULT's nan= or spike= changes at its step (unchanged when unset)."""
    fault = loss_fault(os.environ.get(FAULT_ENV))
    if fault is None:
        return trainer_class
    kind, at = fault

    class LossFault(trainer_class):
        def compute_loss(self, *args, **kwargs):
            result = super().compute_loss(*args, **kwargs)
            step = self.state.global_step + 1  # the step this loss belongs to
            if step == at or (kind == "spike" and step > at):
                factor = float("nan") if kind == "nan" else SPIKE_FACTOR
                if isinstance(result, tuple):
                    return (result[0] * factor, *result[1:])
                return result * factor
            return result

    return LossFault
