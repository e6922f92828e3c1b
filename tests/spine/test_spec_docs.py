"""docs/job-spec.md is generated from the spec (`tunedeck schema --markdown`) and kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tunedeck.backend.spec import FIELD_PATHS
from tunedeck.backend.spec.docs import DOC_PATH, spec_markdown

DOC = Path(__file__).resolve().parents[2] / DOC_PATH
TUNEDECK = str(Path(sys.executable).parent / "tunedeck")


def test_the_field_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == spec_markdown(), (
        f"{DOC_PATH} is stale: regenerate it with `tunedeck schema --markdown > {DOC_PATH}`"
    )


def test_the_reference_lists_every_field_with_its_label_when_it_applies_and_where_it_goes():
    text = spec_markdown()
    for path in FIELD_PATHS:
        assert f"<br>`{path}`" in text, path
    assert (
        "| Gradient checkpointing<br>`training.gradient_checkpointing` | bool | `true` | always "
        "| `activation_checkpointing` |" in text
    )
    assert "| Seed<br>`training.seed` (advanced) |" in text
    assert "| with strategy.kind=zero3 |" in text  # the stage3_* knobs
    assert "| `zero3` | DeepSpeed ZeRO-3" in text  # the strategy table


def test_the_cli_prints_it():
    result = subprocess.run([TUNEDECK, "schema", "--markdown"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == spec_markdown()
