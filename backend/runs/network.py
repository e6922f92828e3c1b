"""A run's measured network (the start record's "network", recipe/network.py) beside the link the estimate assumed
(backend/estimate/speed.py): "measured 1.1 GB/s between machines; the estimate assumed HDR InfiniBand (20 GB/s):
communication will take about 18x longer than predicted"."""

from __future__ import annotations

from tunedeck.backend.estimate.speed import ASSUMED_GPU, Hardware, assumed_ring_gbps

SLOWER = 0.8  # measured under 80% of the assumed rate: the prediction is said to be off


def network_line(start: dict) -> str | None:
    """The comparison in words; None when the run measured nothing."""
    network = start.get("network") or {}
    measured = network.get("all_ranks_gbps")
    if not measured:
        return None
    machines, ranks = int(network.get("machines") or 1), int(network.get("ranks") or 1)
    try:
        hardware = Hardware.named(start.get("gpu_name") or ASSUMED_GPU)
    except ValueError:  # a GPU the table does not know: the assumed one's links
        hardware = Hardware.named(ASSUMED_GPU)
    assumed, link = assumed_ring_gbps(hardware, max(1, ranks // machines), machines)
    where = "between machines" if machines > 1 else "between the processes of one machine"
    line = f"measured {measured:.1f} GB/s {where}; the estimate assumed {link} ({assumed:.0f} GB/s)"
    if measured < SLOWER * assumed:
        line += f": communication will take about {assumed / measured:.1f}x longer than predicted"
    within = network.get("within_machine_gbps")
    return line + (f" · {within:.1f} GB/s within a machine" if within else "")
