"""TUNEDECK_FAULT's faults inside training, for the tests of the training-health guard and of the failure classes
(failures.py):

    nan=30    step 30's loss is NaN (its gradients, then the weights, follow as in a real blow-up)
    spike=30  the loss is multiplied by SPIKE_FACTOR from step 30 on
    oom=30    step 30 raises torch's own CUDA out-of-memory error, with its real text (on CPU too)
    data=30   the data loader fails on a row at step 30, inside the collator, as a malformed row does
    pace=0.5  every micro-batch takes at least 0.5 s, the CPU idle for the rest, as a big model's on a GPU does: the
              tests that train until they stop, kill or requeue a run leave the CPU to everything else meanwhile

"rank=1,oom=30" limits a fault to one rank. The loss faults act in the first attempt only: an attempt after a
roll-back (TUNEDECK_ROLLBACK) trains clean, as a run whose bad data window was skipped would. The other faults (a
rank failing, exiting, a slow phase) are records.py's. Unset in normal use.
"""

from __future__ import annotations

import os
import time

from .ranks import global_rank
from .records import FAULT_ENV, _fault_parts
from .rollback import ROLLBACK_ENV

SPIKE_FACTOR = 50.0
KINDS = ("nan", "spike", "oom", "data")
# torch's CUDA caching allocator's message (c10/cuda/CUDACachingAllocator.cpp), as a 7B run on an 80 GB GPU says it.
CUDA_OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.21 GiB is "
    "free. Including non-PyTorch memory, this process has 77.88 GiB memory in use. Of the allocated memory 74.02 GiB "
    "is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def training_fault(text: str | None) -> tuple[str, int] | None:
    """(kind, step) when TUNEDECK_FAULT names one of KINDS for this rank (a loss fault: not in an attempt after a
    roll-back)."""
    parts = _fault_parts(text)
    kind = next((name for name in KINDS if name in parts), None)
    if kind is None or ("rank" in parts and parts["rank"] not in ("*", str(global_rank()))):
        return None
    if kind in ("nan", "spike") and os.environ.get(ROLLBACK_ENV):
        return None
    return kind, int(parts[kind])


def step_pace(text: str | None) -> float:
    """The seconds each micro-batch takes at least when TUNEDECK_FAULT says pace=SECONDS (0: as fast as it can)."""
    return float(_fault_parts(text).get("pace", 0))


def with_faults(trainer_class: type) -> type:
    """trainer_class, with TUNEDECK_FAULT's pace and its training fault at its step (unchanged when unset)."""
    pace = step_pace(os.environ.get(FAULT_ENV))
    base = _paced(trainer_class, pace) if pace > 0 else trainer_class
    fault = training_fault(os.environ.get(FAULT_ENV))
    if fault is None:
        return base
    kind, at = fault

    class Faulty(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if kind == "data":
                self.data_collator = _failing_collator(self.data_collator, self, at)

        def compute_loss(self, *args, **kwargs):
            result = super().compute_loss(*args, **kwargs)
            step = self.state.global_step + 1  # the step this loss belongs to
            if kind == "oom" and step == at:
                import torch

                raise torch.OutOfMemoryError(CUDA_OOM_TEXT)
            if kind in ("nan", "spike") and (step == at or (kind == "spike" and step > at)):
                factor = float("nan") if kind == "nan" else SPIKE_FACTOR
                if isinstance(result, tuple):
                    return (result[0] * factor, *result[1:])
                return result * factor
            return result

    return Faulty


def _paced(trainer_class: type, pace: float) -> type:
    class Paced(trainer_class):
        def training_step(self, *args, **kwargs):
            began = time.monotonic()
            result = super().training_step(*args, **kwargs)
            time.sleep(max(0.0, pace - (time.monotonic() - began)))
            return result

    return Paced


def _failing_collator(collate, trainer, at: int):
    """`collate`, failing on the batch of step `at` (the loader may fetch a batch ahead: at about that step)."""

    def collator(rows):
        if trainer.state.global_step + 1 >= at:
            raise ValueError(f"fault injected by {FAULT_ENV}: row {len(rows)} of this batch has no usable text")
        return collate(rows)

    return collator
