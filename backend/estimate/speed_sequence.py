"""Sequence parallelism's own time in a step: DeepSpeed Ulysses' all-to-alls (strategy.sequence_parallel).

With N GPUs per sequence every tensor outside attention holds 1/N of the sequence; before attention,
all-to-alls regather the whole sequence for heads / N (q, k and v: three), and one after it returns the
output to sequence slices (Jacobs et al. 2023, "DeepSpeed Ulysses", section 3.1, Figure 2:
https://arxiv.org/abs/2309.14509). The backward pass runs the transposed four, and activation
checkpointing recomputes the forward's four: 8 all-to-alls per layer and micro batch, 12 with
checkpointing. The compute itself needs nothing here: backend/estimate/memory_job.py's `Job.tokens` is already the
GPU's slice of the sequence, and attention's heads / N over the whole sequence are the same FLOPs per
local token as backend/spec/flops.py counts for a whole row.

An all-to-all sends (N-1)/N of each GPU's tensor to the others (NCCL's alltoall: every rank exchanges a
1/N slice with each peer, nccl-tests' doc/PERFORMANCE.md gives its bus bandwidth as the same
(n-1)/n factor). The attention that follows needs the regathered heads, so the exchange sits on the
critical path: DeepSpeed's UlyssesSPAttentionHF (deepspeed/runtime/sequence_parallel/ulysses_sp.py, what
accelerate's parallelism_config sp_size runs) issues it synchronously, nothing overlaps it.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_job import Job


def spans_machines(job: Job) -> bool:
    """The GPUs of a sequence are consecutive ranks: inside one machine when N divides its processes."""
    return job.machines > 1 and job.per_machine % job.sequence_parallel != 0


def all_to_all_seconds(job: Job, grad_accum: int, bytes_per_s: float) -> float:
    """Seconds per optimizer step of Ulysses' all-to-alls on one GPU (0 without sequence parallelism).

    bytes_per_s: one GPU's all-to-all rate over the link its sequence group uses (speed.py's `_bandwidth`,
    inside a machine unless the group spans machines).
    """
    n = job.sequence_parallel
    if n <= 1 or bytes_per_s <= 0:
        return 0.0
    arch = job.arch
    # q and the attention output are q_size wide, k and v kv_size; with fewer key/value heads than N,
    # ulysses_sp.py repeats them to one per GPU first.
    kv = max(arch.kv_size, n * arch.q_size // arch.num_attention_heads)
    per_token = (2 * arch.q_size + 2 * kv) * job.act_bytes
    passes = 3 if job.checkpointing else 2  # forward, backward, and the recomputed forward
    volume = arch.num_hidden_layers * passes * per_token * job.tokens * (n - 1) / n
    return grad_accum * volume / bytes_per_s
