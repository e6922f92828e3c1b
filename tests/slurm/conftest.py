"""The local 2-node Slurm cluster (tests/slurm/local_cluster.py), once per test session.

Tests that use it are marked `slurm` (and `integration` when they train). They skip only
where the Debian packages cannot be installed; a cluster that fails to start fails them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .local_cluster import ClusterUnavailable, LocalCluster, install_packages


@pytest.fixture(scope="session")
def slurm_cluster():
    try:
        install_packages()
    except ClusterUnavailable as exc:
        pytest.skip(f"no local Slurm cluster: {exc}")
    cluster = LocalCluster().start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # every sbatch/squeue/scancel of the session, the panel's too
    try:
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="session")
def shared_runs_dir(tmp_path_factory) -> Path:
    """A runs folder both nodes see: not under /tmp (same host here, but the node-local warning looks at the path)."""
    base = Path(os.environ.get("TUNEDECK_SHARED_TMP", "/var/tmp"))
    folder = base / f"tunedeck-slurm-runs-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
