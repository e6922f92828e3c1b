"""Fixtures shared by every part of the suite.

The demo model, tokenizer and data are built once per machine (deterministically, no
downloads) and cached under $TUNEDECK_HOME/demo (default ~/.cache/tunedeck/demo), so a
second test session does not rebuild them.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_home() -> Path:
    """The built demo folder: model/, data/train.jsonl, data/eval.jsonl, formats/<format>.jsonl."""
    from tunedeck.backend.demo import ensure_demo

    return ensure_demo()


@pytest.fixture
def demo_spec(demo_home):
    """Factory: the demo preset's JobSpec with dotted-path overrides, e.g. demo_spec({"training.max_steps": 3})."""
    from tunedeck.backend.spec import resolve_spec, set_paths

    def make(overrides: dict | None = None):
        spec = resolve_spec("demo")
        return set_paths(spec, overrides) if overrides else spec

    return make


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    """An empty runs folder for this test."""
    path = tmp_path / "runs"
    path.mkdir()
    return path

