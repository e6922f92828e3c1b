"""How much an advisor refresh costs next to one estimate, measured side by side.

    .venv/bin/python bench/bench_estimate.py

The panel recomputes the estimate, the strategy table and the recommendation on every
form change, so all three must stay cheap. Prints the time per call and the ratio of
compare_strategies (every strategy) to one estimate.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.estimate import compare_strategies, estimate, recommend  # noqa: E402
from backend.spec import load_presets  # noqa: E402


def per_call(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def main() -> int:
    print(f"{'preset':18s} {'estimate':>11s} {'compare':>11s} {'recommend':>11s} {'compare/estimate':>17s}")
    for preset_id, preset in load_presets().items():
        spec = preset.build()
        one = per_call(lambda: estimate(spec), 200)
        every = per_call(lambda: compare_strategies(spec, 80), 20)
        advice = per_call(lambda: recommend(spec, 80), 20)
        print(f"{preset_id:18s} {one * 1e3:9.3f}ms {every * 1e3:9.3f}ms {advice * 1e3:9.3f}ms {every / one:16.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
