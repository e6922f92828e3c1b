"""Fixtures of the Slurm tests. The cluster itself (slurm_cluster, shared_runs_dir) is in tests/conftest.py,
so that the panel's browser tests share the one cluster of the session."""

from __future__ import annotations

import pytest

from tunedeck.tests.runs.conftest import small_disk  # noqa: F401 - a real tmpfs of a given size
from tunedeck.tests.slurm.login_node import LoginNode


@pytest.fixture(scope="module")
def bare_login_node(tmp_path_factory):
    """A login node without a cluster behind it, for the link's own tests."""
    node = LoginNode(tmp_path_factory.mktemp("no-cluster") / "slurm.conf")
    yield node
    node.stop()


@pytest.fixture
def ssh_link(bare_login_node):
    from tunedeck.backend.runs.ssh_link import SshLink

    node = bare_login_node
    return SshLink("127.0.0.1", node.user, node.port, str(node.user_key), str(node.known_hosts))
