"""The rank that holds the others back in steady state, named from the log records' "ranks" (each rank's own part of
a step: its batch wait and its forward pass, recipe/rank_timing.py).

Every rank's step lasts as long as the slowest one's under DDP, ZeRO and FSDP, so the step time names nobody; a rank
whose own part stays more than LATE_BY (and LATE_S) above the median of the other ranks' for LATE_FOR logging steps
in a row does:
"rank 1 on gpu-b arrives 38% after the median for 40 steps (its data loader waits 0.40 s a step)".
"""

from __future__ import annotations

import statistics

from tunedeck.backend.runs.records import LogRecord, RankPart

LATE_BY = 0.25  # a rank's own part 25% over the others' median
LATE_FOR = 5  # logging steps in a row
LATE_S = 0.05  # and at least 50 ms: a few milliseconds either way are the scheduler's noise, not a slow rank


def own_part(part: RankPart) -> float:
    return float(part.get("data_s", 0.0)) + float(part.get("forward_s", 0.0))


def lateness(ranks: list[RankPart]) -> dict[int, float]:
    """The ranks whose own part is late on the median of the others' (by LATE_BY and LATE_S at least), each with
    how much (0.38: 38% after them)."""
    late = {}
    for part in ranks:
        others = [own_part(p) for p in ranks if p is not part]
        median = statistics.median(others) if others else 0.0
        excess = own_part(part) - median
        if excess >= LATE_S and excess > LATE_BY * median:
            late[int(part.get("rank", 0))] = excess / max(median, 1e-3)
    return late


def slow_rank_line(records: list[LogRecord]) -> str | None:
    """The rank late by LATE_BY for the last LATE_FOR logging steps (or more), in words; None when there is none."""
    logged = [r for r in records if r.get("ranks")]
    if len(logged) < LATE_FOR:
        return None
    lates = [lateness(record.get("ranks") or []) for record in logged]  # once a record
    streak: dict[int, int] = {}
    for late in lates:
        streak = {rank: streak.get(rank, 0) + 1 for rank in late}
    if not streak:
        return None
    rank, count = max(streak.items(), key=lambda item: item[1])
    if count < LATE_FOR:
        return None
    recent = logged[-count:]
    parts = [next(p for p in r.get("ranks") or [] if int(p.get("rank", 0)) == rank) for r in recent]
    by = statistics.mean(late[rank] for late in lates[-count:])
    data = statistics.mean(float(p.get("data_s", 0.0)) for p in parts)
    forward = statistics.mean(float(p.get("forward_s", 0.0)) for p in parts)
    others = [p for r in recent for p in r.get("ranks") or [] if int(p.get("rank", 0)) != rank]
    usual_data = statistics.median(float(p.get("data_s", 0.0)) for p in others) if others else 0.0
    usual_forward = statistics.median(float(p.get("forward_s", 0.0)) for p in others) if others else 0.0
    if data - usual_data >= forward - usual_forward:
        why = f"its data loader waits {data:.2f} s a step, the others {usual_data:.2f} s"
    else:
        why = f"its forward pass takes {forward:.2f} s, the others' {usual_forward:.2f} s"
    steps = recent[-1].get("step", 0) - recent[0].get("step", 0) + 1
    host = parts[-1].get("host", "?")
    return f"⚠ rank {rank} on {host} arrives {by:.0%} after the median for {steps} steps ({why})"
