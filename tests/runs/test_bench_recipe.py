"""bench/bench_recipe.py at a tiny size: both recipes train through the bundle launch and report sane figures."""

from __future__ import annotations

import math

import pytest

from .helpers import run_bench

pytestmark = [
    pytest.mark.bench,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),
]  # two 2-rank trainings


def test_recipe_bench_reports_both_recipes(tmp_path, demo_home):
    args = ["--rows", "48", "--eval-rows", "8", "--max-len", "128"]
    report, stderr = run_bench("bench_recipe.py", *args, folder=tmp_path)
    seed, ours = report["seed_002"], report["tunedeck"]
    assert seed["training_args"]["packing"] is False and seed["training_args"]["pad_to_multiple_of"] == 128
    assert ours["training_args"]["packing"] is True and ours["training_args"]["optim"] == "adamw_torch_fused"
    for recipe in (seed, ours):
        assert recipe["steps"] >= 1 and recipe["tokens_per_s"] > 0
        assert math.isfinite(recipe["eval_loss"]) and recipe["eval_loss"] > 0
    # Both trained on the same rows: about the same useful tokens (the seed's last batch repeats a few rows).
    assert ours["tokens"] == pytest.approx(seed["tokens"], rel=0.25)
    assert report["tokens_per_s_ratio"] > 0 and 0 < report["padding_share_seed"] < 1
    assert report["adamw_fused_step_speedup"] > 0
    assert "useful tokens/s: tunedeck" in stderr
