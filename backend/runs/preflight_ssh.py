"""Checks of a Slurm job submitted over SSH (launch.slurm.ssh.host), before anything is uploaded.

The key and known_hosts files named exist here; then one call through the shared connection asks the
login node for `sbatch --version`: a host key not yet known, a refused key or a login node without
Slurm is said here, naming the field and the fix, and Start refuses (nothing is half-launched).
The answer is kept for a short while: the page asks on every change of the form.
"""

from __future__ import annotations

import os
import time

from tunedeck.backend.runs.ssh_link import SshLink, SshUnreachable
from tunedeck.backend.spec.problem import Problem, refused_here

ANSWER_KEPT_S = 30.0
_answers: dict[SshLink, tuple[float, list[Problem]]] = {}


def ssh_problems(ssh) -> list[Problem]:
    """Problems of launch.slurm.ssh (an empty host: none, sbatch runs here)."""
    if not ssh.host:
        return []
    problems = []
    for name in ("identity_file", "known_hosts_file"):
        path = getattr(ssh, name)
        if path and not os.path.isfile(os.path.expanduser(path)):
            problems.append(
                refused_here(
                    f"launch.slurm.ssh.{name}", f"{path} is not a file here: give the path of an existing file"
                )
            )
    if problems:
        return problems
    link = SshLink.from_spec(ssh)
    kept = _answers.get(link)
    if kept and time.monotonic() - kept[0] < ANSWER_KEPT_S:
        return kept[1]
    problems = _ask(link)
    _answers[link] = (time.monotonic(), problems)
    return problems


def _ask(link: SshLink) -> list[Problem]:
    try:
        done = link.run(["sbatch", "--version"], timeout=20)
    except SshUnreachable as exc:
        said = str(exc)
        if "Host key verification failed" in said or "No ED25519 host key" in said or "host key" in said.lower():
            fix = (
                f"its host key is not known here: check and accept it once (ssh {link.host}), "
                "or name a known_hosts file that holds it (launch.slurm.ssh.known_hosts_file)"
            )
        elif "Permission denied" in said:
            fix = "the login node refused the key: give launch.slurm.ssh.identity_file, or load the key in ssh-agent"
        else:
            fix = "check launch.slurm.ssh.host and .port, and that this machine reaches it (ssh HOST)"
        return [refused_here("launch.slurm.ssh.host", f"cannot reach {link.name} ({said}): {fix}")]
    if done.returncode:
        return [
            refused_here(
                "launch.slurm.ssh.host",
                f"{link.name} answers, but sbatch does not run there: give the cluster's login node",
            )
        ]
    return []
