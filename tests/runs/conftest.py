"""Fixtures of the run tests: small real disks (tmpfs) that fill up."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(size) -> a folder on a real tmpfs of that size (e.g. "1m"), unmounted after the test."""
    mounts = []

    def make(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounts)}"
        folder.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
        )
        if result.returncode != 0:
            # CI runs as root: there a tmpfs that cannot be mounted fails the test instead of hiding it.
            unavailable = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
            unavailable(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
        mounts.append(folder)
        return folder

    yield make
    for folder in mounts:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)
