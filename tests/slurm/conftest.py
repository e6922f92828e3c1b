"""Fixtures of the Slurm tests. The cluster itself (slurm_cluster, shared_runs_dir) is in tests/conftest.py,
so that the panel's browser tests share the one cluster of the session."""

from __future__ import annotations

from tunedeck.tests.runs.conftest import small_disk  # noqa: F401 - a real tmpfs of a given size
