"""Refit the speed model's constants on the published runs, and print the error on those and on the held-out third.

    .venv/bin/python bench/fit_speed.py

The rows are tests/data/measured_throughput.yaml; the split is bench/speed_accuracy.py's `split` (within each
publisher, every third row by the SHA-256 of its id), fixed before fitting. `fit` takes the fit rows only and
minimises the mean squared log error of the predicted useful tokens/s (a run 2x too fast weighs as one 2x too
slow) over the seven constants of backend/estimate/speed_compute.py's SpeedConstants, by Nelder-Mead on their logarithms
(the efficiencies' logits within BOUNDS) from the constants in force. The constants it prints are what FITTED
holds; the report after them is bench/speed_accuracy.py's, with the refitted constants.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import speed_accuracy as accuracy

from tunedeck.backend.estimate.speed_compute import FITTED, SpeedConstants

NAMES = [f.name for f in dataclasses.fields(SpeedConstants)]
RESTARTS = 3
BOUNDS = {"efficiency_full": (0.05, 0.8), "efficiency_lora": (0.05, 0.8), "efficiency_qlora": (0.05, 0.8)}


def loss(constants: SpeedConstants, prepared: list[tuple[dict, tuple]]) -> float:
    """Mean squared log error of the predictions over the prepared rows."""
    total = 0.0
    for row, inputs in prepared:
        total += math.log(accuracy.predicted(row, constants, inputs) / accuracy.measured(row)) ** 2
    return total / len(prepared)


def fit(rows: list[dict], start: SpeedConstants = FITTED, iterations: int = 2000) -> SpeedConstants:
    """The constants that best predict `rows` (only these: the caller passes the fit rows)."""
    prepared = [(row, accuracy.prepared(row)) for row in rows]

    def objective(x: list[float]) -> float:
        return loss(_constants(x), prepared)

    x = _coordinates(start)
    for _ in range(RESTARTS):  # a restart from the best point rebuilds a simplex that may have collapsed
        x = nelder_mead(objective, x, iterations)
    return _constants(x)


def _coordinates(constants: SpeedConstants) -> list[float]:
    """Unbounded coordinates of the constants: the logit of a bounded one's place in its bounds, else the log."""
    out = []
    for name in NAMES:
        value = getattr(constants, name)
        if name in BOUNDS:
            lo, hi = BOUNDS[name]
            share = min(max((value - lo) / (hi - lo), 1e-6), 1 - 1e-6)
            out.append(math.log(share / (1 - share)))
        else:
            out.append(math.log(value))
    return out


def _constants(x: list[float]) -> SpeedConstants:
    values = {}
    for name, v in zip(NAMES, x, strict=True):
        if name in BOUNDS:
            lo, hi = BOUNDS[name]
            values[name] = lo + (hi - lo) / (1 + math.exp(-v))
        else:
            values[name] = math.exp(v)
    return SpeedConstants(**values)


def nelder_mead(f, x0: list[float], iterations: int, step: float = 0.3) -> list[float]:
    """Minimise f from x0 (the textbook simplex: reflect, expand, contract, shrink)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s, strict=True)] for s in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
        size = max(abs(a - b) for x in simplex[1:] for a, b in zip(x, simplex[0], strict=True))
        if max(values) - min(values) < 1e-12 and size < 1e-6:
            break
    return simplex[min(range(n + 1), key=values.__getitem__)]


def main() -> int:
    rows = accuracy.load_rows()
    fit_rows, _held = accuracy.split(rows)
    constants = fit(fit_rows)
    print("FITTED = SpeedConstants(")
    for name in NAMES:
        print(f"    {name}={getattr(constants, name):.4g},")
    print(")\n")
    accuracy.report(rows, constants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
