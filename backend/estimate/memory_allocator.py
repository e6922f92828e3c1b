"""What PyTorch's caching allocator reserves beyond the tensors it hands out, in the training phase.

Three figures describe one GPU, and each published peak is one of them (tests/data/measured_peaks.yaml, "measure"):
  allocated  torch.cuda.max_memory_allocated: the live tensors, each rounded up to 512 bytes; the memory terms of
             backend/estimate/memory_train.py count these
  reserved   torch.cuda.max_memory_reserved: every segment the allocator holds, live or cached. A freed tensor's
             block stays reserved for the next request of its stream (one pool per stream) and is split to serve a
             smaller one; requests up to 1 MiB share 2 MiB segments, larger ones get 20 MiB segments below 10 MiB
             and their own segment, rounded up to 2 MiB, above (c10/cuda/CUDACachingAllocator.cpp: kSmallBuffer,
             kLargeBuffer, kMinLargeAlloc, kRoundLarge). Where no cached block is large enough in one piece, a new
             segment is allocated while the pieces stay: fragmentation
  device     what nvidia-smi shows: reserved plus the CUDA context and NCCL's buffers (memory_job.device_overhead)
Before it reports an out-of-memory the allocator frees its cached blocks and retries (release_cached_blocks), so the
cache never pushes the tensors off a full card: near the card's size reserved is the tensors plus what was left.
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True grows segments in place instead; no published run here used it,
and tunedeck does not set it.

The model, in bytes of the training phase (`allocator_bytes`):
  share of the step     the step's activations and loss tensors (and GRPO's generation) are freed and allocated
                        again every step, in blocks of many sizes; a share of them stays cached beside the live ones
  varying shapes        more when the shapes change from step to step (rows padded per batch, not packed): the
                        loss's vocabulary-sized tensors are the step's largest blocks, each a segment of its own;
                        one cached for a step's length is split to serve a shorter step and cannot serve a longer
                        one, which takes new segments (PyTorch's CUDA notes recommend expandable_segments for a
                        "changing batch size"). Where the loss never materialises the logits (TRL's chunked loss,
                        what tunedeck trains with) these tensors are small
  communication         FSDP's gathered units and the gradient buckets live on their own streams, whose cached blocks
                        the compute stream cannot reuse
  FSDP1 wrap from CPU   a loader that builds the model on rank 0's CPU and lets FSDP 1 move, broadcast
                        (sync_module_states), flatten and shard it unit by unit on the GPU leaves the blocks of those
                        copies cached; Answer.AI's train.py resets the peak statistics after the wrap, so its
                        reserved peak never falls below what the wrap left (its LoRA run on Llama-2 7B: 10.24 GiB
                        reserved at 512 tokens and 10.22 at 2048, while allocated grew from 8.28 to 9.16 GiB)
The sizes of these shares are not in any code: bench/fit_memory.py fits them on the published peaks it may see (the
fit rows of bench/estimate_accuracy.py), never on the held-out third.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunedeck.backend.estimate.memory_job import Job


@dataclass(frozen=True)
class AllocatorConstants:
    activations: float  # share of the step's activations and loss tensors, the shapes alike every step
    varying: float  # share of the loss's vocabulary-sized tensors, when the shapes change every step
    communication: float  # share of the gathered units and gradient buckets
    wrap: float  # FSDP 1 wrap from rank 0's CPU copy: cached blocks it leaves, in units of the root unit's size


# Fitted by bench/fit_memory.py on the published peaks it may see (never the held-out third).
FITTED = AllocatorConstants(activations=0.52, varying=1.9, communication=0.75, wrap=4.5)


def allocator_bytes(
    job: Job, step: float, loss: float, communication: float, constants: AllocatorConstants = FITTED
) -> float:
    """Bytes reserved beyond the tensors at the training phase's peak: `step` is the bytes of the step's activations
    and loss tensors (and generation), `loss` those of the loss's vocabulary-sized tensors, `communication` those of
    the gathered units and buckets."""
    overhead = constants.activations * step + constants.communication * communication
    if job.varying_shapes:
        overhead += constants.varying * loss
    if job.software.wraps_from_cpu and job.layout.is_fsdp:
        # The wrap's cached blocks serve the step's tensors first: what the step needs beyond them is the share.
        overhead = max(overhead, constants.wrap * job.root_unit_bytes - step)
    return overhead
