"""The network measured before the model loads: a short all-reduce sweep across the ranks, as nccl-tests runs it.

For each message size (1, 4, 16, 64 MiB, as far as the time budget goes) the ranks all-reduce a float32 tensor a few
times after a warm-up; the bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): algorithm bandwidth (bytes / time)
times 2(n-1)/n, the share of the data each rank's link carries in a ring, so that it compares with the link's rate
whatever the number of ranks. Measured over every rank (the ring's slowest link: between machines when there are
several) and, on several machines, within each machine (the slowest machine's). The start record holds it as
"network"; backend/runs compares it with the link the estimate assumed.

launch.network_check: true, false, or unset (on for a job on more than one machine). Bounded to BUDGET_S.
"""

from __future__ import annotations

import math
import time

SIZES_MB = (1, 4, 16, 64)
BUDGET_S = 4.0  # the whole sweep, both scopes: a larger size is measured only while the budget allows
MIN_REPEATS, MIN_SECONDS, MAX_REPEATS = 3, 0.1, 50


def wanted(job: dict) -> bool:
    launch = job.get("launch") or {}
    asked = launch.get("network_check")
    return bool(asked) if asked is not None else int(launch.get("num_machines") or 1) > 1


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def _sweep(group, ranks: int, device, deadline: float) -> list[dict]:
    """[{"size_mb", "seconds", "bus_gbps"}] for the sizes the deadline allows (every rank stops at the same size:
    rank 0's clock decides, broadcast)."""
    import torch
    import torch.distributed as dist

    measured = []
    root = dist.get_global_rank(group, 0) if group is not None else 0
    for size_mb in SIZES_MB:
        go = torch.tensor([1.0 if time.monotonic() < deadline else 0.0], device=device)
        dist.broadcast(go, src=root, group=group)
        if not go.item():
            break
        tensor = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32, device=device)
        dist.all_reduce(tensor, group=group)  # warm-up: connections, buffers
        started = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # How many repeats fill MIN_SECONDS, by rank 0's clock, for every rank: a count each rank chose by its own
        # clock differed between ranks, and the ranks waited on each other's all-reduce for ever (seen on 2 nodes).
        once = max(time.perf_counter() - started, 1e-6)
        count = torch.tensor([float(min(MAX_REPEATS, max(MIN_REPEATS, math.ceil(MIN_SECONDS / once))))], device=device)
        dist.broadcast(count, src=root, group=group)
        repeats, started = int(count.item()), time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(tensor, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / repeats
        measured.append(
            {"size_mb": size_mb, "seconds": seconds, "bus_gbps": bus_bandwidth(size_mb * 2**20, seconds, ranks)}
        )
    return measured


def measure_network(job: dict, nodes: list[str]) -> dict | None:
    """The sweep over every rank and within each machine (`nodes`: rank i's machine, from every rank); None when
    not wanted or on one process. A collective: every rank calls it."""
    import torch
    import torch.distributed as dist

    if not wanted(job) or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    started = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    world = dist.get_world_size()
    machines = sorted(set(nodes))
    across = _sweep(None, world, device, started + BUDGET_S / 2)
    record = {
        "ranks": world,
        "machines": len(machines),
        "backend": dist.get_backend(),
        "all_ranks": across,
        "all_ranks_gbps": across[-1]["bus_gbps"] if across else None,
    }
    groups = [[rank for rank, node in enumerate(nodes) if node == machine] for machine in machines]
    if len(machines) > 1 and all(len(g) > 1 for g in groups):
        mine, _ = dist.new_subgroups_by_enumeration(groups)  # every rank takes part in making every group
        within = _sweep(mine, len(groups[machines.index(nodes[dist.get_rank()])]), device, started + BUDGET_S)
        value = torch.tensor([within[-1]["bus_gbps"] if within else float("inf")], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)  # the slowest machine's
        record["within_machine_gbps"] = value.item() if value.item() != float("inf") else None
    record["seconds"] = round(time.monotonic() - started, 2)
    return record
