"""The job spec's launch.slurm.ssh: Slurm reached from another machine, over OpenSSH.

The panel or the CLI runs on a workstation; `sbatch`, `squeue`, `scontrol` and `scancel` run on
the cluster's login node through one multiplexed OpenSSH connection (backend/runs/ssh_link.py).
Only names are kept here: keys stay in files the user's OpenSSH reads, never in the bundle.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from tunedeck.backend.spec.sections import BASIC, SpecSection

# A host name, an address or a ~/.ssh/config alias. Never a leading '-' (ssh would read an option).
SSH_HOST = re.compile(r"^[A-Za-z0-9_.:\[\]%][A-Za-z0-9_.:\[\]%-]{0,252}$")
SSH_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class SlurmSshSpec(SpecSection):
    """Where sbatch runs when it is not on this machine: the cluster's login node, over SSH."""

    host: str | None = Field(
        default=None,
        title="Login node (SSH)",
        json_schema_extra=BASIC,
        description=(
            "The cluster's login node, or a Host alias of ~/.ssh/config; empty: sbatch runs on this machine. "
            "Its host key must already be known (ssh HOST once, or launch.slurm.ssh.known_hosts_file)."
        ),
    )
    user: str | None = Field(
        default=None, title="SSH user", description="User on the login node; empty: ~/.ssh/config's or yours."
    )
    port: int = Field(default=0, ge=0, le=65535, title="SSH port", description="0: ~/.ssh/config's port, or 22.")
    identity_file: str | None = Field(
        default=None,
        title="SSH key file",
        description="Private key file on this machine; empty: your agent's keys and ~/.ssh/config's.",
    )
    known_hosts_file: str | None = Field(
        default=None,
        title="Known hosts file",
        description="A known_hosts file holding the login node's key; empty: ~/.ssh/known_hosts. Keys are never accepted unseen.",
    )
    runs_dir: str = Field(
        default="tunedeck-runs",
        title="Remote runs folder",
        json_schema_extra=BASIC,
        description="Folder on the cluster, seen by every node, where each run's folder goes; relative to the remote home.",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None and not SSH_HOST.match(value):
            raise ValueError(f"{value!r} is not a host name: letters, digits and . - _ : only, never starting with '-'")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not SSH_USER.match(value):
            raise ValueError(f"{value!r} is not a user name: letters, digits and . - _ only, never starting with '-'")
        return value

    @field_validator("runs_dir")
    @classmethod
    def _runs_dir(cls, value: str) -> str:
        if not value.strip() or value.startswith("-") or "\x00" in value:
            raise ValueError(f"{value!r} is not a folder: give a path, relative to the remote home or absolute")
        return value
