"""The rank that holds the others back, named from each rank's own part of a step (backend/runs/slow_rank.py). The
real 2-rank run with one rank slowed: tests/panel/test_browser_restarts.py."""

from __future__ import annotations

from tunedeck.backend.runs import slow_rank_line


def log(step: int, *parts: tuple[float, float]) -> dict:
    ranks = [{"rank": r, "host": f"gpu-{'ab'[r % 2]}", "data_s": d, "forward_s": f} for r, (d, f) in enumerate(parts)]
    return {"event": "log", "step": step, "loss": 1.0, "ranks": ranks}


def test_a_rank_late_for_five_logging_steps_is_named_with_what_makes_it_late():
    steady = [log(s, (0.01, 0.10), (0.01, 0.10), (0.01, 0.11)) for s in range(1, 4)]
    assert slow_rank_line(steady) is None
    slow_data = [log(s, (0.01, 0.10), (0.40, 0.10), (0.01, 0.10)) for s in range(4, 44)]
    assert slow_rank_line(steady + slow_data[:4]) is None  # four logging steps: not yet
    assert slow_rank_line(steady + slow_data) == (
        "⚠ rank 1 on gpu-b arrives 355% after the median for 40 steps (its data loader waits 0.40 s a step, the "
        "others 0.01 s)"
    )
    slow_compute = [log(s, (0.01, 0.10), (0.01, 0.10), (0.01, 0.30)) for s in range(44, 49)]
    assert slow_rank_line(steady + slow_data + slow_compute) == (
        "⚠ rank 2 on gpu-a arrives 182% after the median for 5 steps (its forward pass takes 0.30 s, the others' "
        "0.10 s)"
    )
    recovered = [log(s, (0.01, 0.10), (0.01, 0.10), (0.01, 0.10)) for s in range(49, 50)]
    assert slow_rank_line(steady + slow_data + slow_compute + recovered) is None


def test_one_process_and_records_without_ranks_name_none():
    assert slow_rank_line([{"event": "log", "step": s, "loss": 1.0} for s in range(10)]) is None
    assert slow_rank_line([log(s, (0.0, 0.0), (0.0, 0.0)) for s in range(10)]) is None
    # three times the other's, but 20 ms: the scheduler's noise on a busy machine, not a slow rank
    assert slow_rank_line([log(s, (0.01, 0.0), (0.03, 0.0)) for s in range(10)]) is None
