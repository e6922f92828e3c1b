"""Each rank's own part of a step, for naming the rank that holds the others back in steady state.

Under DDP (and ZeRO, FSDP) the gradient all-reduce makes every rank's step equally long: the ranks that are ready
wait in it for the slowest. So step times name nobody; a rank's own part does (traceopt-ai/traceml#252). Each rank
measures, per micro-batch, the time it waited for its batch (from the end of its previous micro-batch to the start
of its forward pass: the data loader, the collator, moving the batch) and its forward pass (no collective runs in
it under DDP), and at each logging step every rank's means since the last one are gathered to rank 0, which writes
them in the log record as "ranks": [{"rank", "host", "data_s", "forward_s"}]. backend/runs/slow_rank.py names a rank
whose part stays well above the others'.

TUNEDECK_FAULT="rank=1,slow=0.3" makes rank 1 wait 0.3 s more for each batch (",slow_from=STEP": from that step on),
as a rank with a slow data loader or disk would.
"""

from __future__ import annotations

import os
import time

from .ranks import gather_from_ranks, global_rank, node_name
from .records import FAULT_ENV, _fault_parts


def slow_fault(text: str | None) -> tuple[float, int] | None:
    """(seconds, from step) when TUNEDECK_FAULT slows this rank's batches."""
    parts = _fault_parts(text)
    if "slow" not in parts or parts.get("rank", "*") not in ("*", str(global_rank())):
        return None
    return float(parts["slow"]), int(parts.get("slow_from", 0))


class RankTiming:
    """Hooks on the model's forward pass: this rank's batch wait and forward time per micro-batch."""

    def __init__(self, trainer):
        self.trainer = trainer
        self._ready = time.perf_counter()  # when this rank was ready for its next batch
        self._forward_start = 0.0
        self._data, self._forward, self._count = 0.0, 0.0, 0
        self._slow = slow_fault(os.environ.get(FAULT_ENV))
        model = trainer.model
        model.register_forward_pre_hook(self._before_forward)
        model.register_forward_hook(self._after_forward)

    def _before_forward(self, module, args):
        if not module.training:
            return
        if self._slow and self.trainer.state.global_step + 1 >= self._slow[1]:
            time.sleep(self._slow[0])  # the fault: a batch that takes this much longer to arrive
        self._forward_start = time.perf_counter()
        self._data += self._forward_start - self._ready

    def _after_forward(self, module, args, output):
        if not module.training or not self._forward_start:
            return
        self._forward += time.perf_counter() - self._forward_start
        self._count += 1
        self._forward_start = 0.0

    def micro_batch_done(self) -> None:
        """The end of a micro-batch (its backward and, at a step's end, the optimizer): the next batch's wait
        starts here."""
        self._ready = time.perf_counter()

    def gathered(self) -> list[dict] | None:
        """Every rank's mean batch wait and forward time since the last call (a collective: every rank calls it at
        the same logging step); None on one process."""
        count = max(self._count, 1)
        mine = {
            "rank": global_rank(),
            "host": node_name(),
            "data_s": round(self._data / count, 5),
            "forward_s": round(self._forward / count, 5),
        }
        self._data, self._forward, self._count = 0.0, 0.0, 0
        everyone = gather_from_ranks(mine)
        return everyone if len(everyone) > 1 else None
