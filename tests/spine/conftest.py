"""Shared helpers of the spine tests: render a spec into a folder, and check it with the real libraries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunedeck.backend.recipe.vocabulary import STRATEGIES
from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.spec import JobSpec, load_presets

PRESET_IDS = sorted(load_presets())
STRATEGY_KINDS = list(STRATEGIES)


@pytest.fixture
def export(tmp_path: Path):
    """export(spec) -> folder holding the rendered bundle (a fresh folder per call)."""
    counter = iter(range(1_000_000))

    def _export(spec: JobSpec) -> Path:
        folder = tmp_path / f"bundle{next(counter)}"
        write_bundle(render_bundle(spec), folder)
        return folder

    return _export


@pytest.fixture(scope="session")
def check():
    """tunedeck.backend.render.bundle_check.check_bundle, imported once: accelerate, TRL and DeepSpeed load here."""
    from tunedeck.backend.render.bundle_check import check_bundle

    return check_bundle
