"""What the engines need to know about a job's model: the layer class FSDP wraps, the NVMe buffer
DeepSpeed swaps through. Read by the generators (render/) and by validation, which says when
tunedeck cannot know them; so neither imports the other.
"""

from __future__ import annotations

import math

from tunedeck.backend.spec import catalog
from tunedeck.backend.spec.job import JobSpec

# DeepSpeed's default offload_param.buffer_size (runtime/zero/offload_config.py), in elements.
DEFAULT_NVME_BUFFER_SIZE = 100_000_000


def fsdp_layer_cls(spec: JobSpec) -> str | None:
    """The decoder layer class FSDP wraps: the spec's, else the model architecture's, else None."""
    explicit = spec.strategy.fsdp_transformer_layer_cls_to_wrap
    if explicit:
        return explicit
    arch = catalog.lookup(spec.model.name_or_path)
    return arch.decoder_layer_cls if arch is not None else None


def nvme_param_buffer_size(spec: JobSpec) -> int | None:
    """Elements per NVMe swap buffer so the largest parameter partition fits; None for an unknown model.

    DeepSpeed 0.19.8 swaps each rank's partition of a parameter, ceil(numel / world size) elements,
    through one buffer and asserts "More elements ... than buffer size" when it is bigger
    (partitioned_param_swapper.get_buffer). The embedding (vocab x hidden) is usually the largest:
    131M elements for Llama-2-7B, so the default 1e8 fails on one GPU (525M for Llama-3-8B: 1-5 GPUs).
    """
    arch = catalog.lookup(spec.model.name_or_path)
    if arch is None:
        return None
    partition = math.ceil(arch.largest_layer_params / spec.launch.num_processes)  # an upper bound: a whole module
    return max(DEFAULT_NVME_BUFFER_SIZE, partition)
