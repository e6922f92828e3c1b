"""How a run ends: no process group outlives train.py's close, so none is torn down with the interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PROBE = Path(__file__).with_name("teardown_probe.py")


def test_closing_a_ulysses_run_releases_every_process_group(tmp_path):
    result = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", str(PROBE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"held-{rank}.json").read_text())
        assert report["sum"] == 2  # the sequence group worked before it was closed
        assert not any(report["held"].values()), report  # DeepSpeed's references went with the groups
