"""This process among the others: its rank, the world size, its node, and what every rank says (collectives)."""

from __future__ import annotations

import os
import socket


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def node_name() -> str:

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gather_from_ranks(value) -> list:
    """Every rank's value, in rank order (a collective: all ranks call it); [value] without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def _any_rank(flag: bool, device) -> bool:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    tensor = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())
