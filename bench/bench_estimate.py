"""How much an advisor refresh costs next to one estimate, measured side by side.

    .venv/bin/python bench/bench_estimate.py

The panel computes one Advice (the job, every strategy, the recommendation) on every form
change, and the table, chart and text read it, so it must stay cheap. Prints the time per
call of one estimate (both phases) and of advise (every strategy and the recommendation: what
a form change costs), and the ratio of advise to one estimate.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.spec import load_presets


def per_call(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def main() -> int:
    print(f"{'preset':18s} {'estimate':>11s} {'advise':>11s} {'advise/estimate':>16s}")
    for preset_id, preset in load_presets().items():
        spec = preset.build()
        one = per_call(lambda spec=spec: estimate(spec), 200)
        advice = per_call(lambda spec=spec: advise(spec, 80), 20)
        print(f"{preset_id:18s} {one * 1e3:9.3f}ms {advice * 1e3:9.3f}ms {advice / one:15.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
