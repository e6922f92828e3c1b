"""A cluster's login node on this machine: OpenSSH's server on 127.0.0.1, for the Slurm-over-SSH tests.

Debian's sshd (openssh-server; apt-get installs it when missing, as root) runs in the foreground as
our child with a configuration of its own in a temporary folder: a host key and a user key made for
the test, key authentication only, the user key the one authorised key, and SLURM_CONF set for
every session (SetEnv), as a real login node's environment points its Slurm commands at its
cluster. The client side gets a known_hosts file that pins the host key (StrictHostKeyChecking
stays on: nothing is accepted unseen). cut() stops the server and ends every connection through
it (the shared ControlMaster's too), as a lost network would; restore() starts it again on the
same port with the same keys.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"


class LoginNodeUnavailable(Exception):
    """Why no test login node can run here."""


def install_sshd() -> None:
    if Path(SSHD).exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise LoginNodeUnavailable("sshd is missing: apt-get install -y openssh-server")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "openssh-server"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise LoginNodeUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-400:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LoginNode:
    def __init__(self, slurm_conf: Path):
        install_sshd()
        self.folder = Path(tempfile.mkdtemp(prefix="tunedeck-login-"))
        self.slurm_conf = slurm_conf
        self.port = _free_port()
        self.user = os.environ.get("USER") or "root"
        self.host_key = self.folder / "host_ed25519"
        self.user_key = self.folder / "user_ed25519"
        self.known_hosts = self.folder / "known_hosts"
        for key in (self.host_key, self.user_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (self.folder / "authorized_keys").write_text(self.user_key.with_suffix(".pub").read_text())
        host_public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_public[0]} {host_public[1]}\n")
        (self.folder / "sshd_config").write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.folder / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.folder / 'authorized_keys'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",  # the test's folder is under /tmp
                    "UsePAM no",
                    "MaxSessions 50",
                    "MaxStartups 50",
                    f"SetEnv SLURM_CONF={self.slurm_conf}",
                    "",
                ]
            )
        )
        self.process: subprocess.Popen | None = None
        self.restore()

    def spec_values(self) -> dict:
        """launch.slurm.ssh for this login node, as a form or --set gives it."""
        return {
            "launch.slurm.ssh.host": "127.0.0.1",
            "launch.slurm.ssh.port": self.port,
            "launch.slurm.ssh.user": self.user,
            "launch.slurm.ssh.identity_file": str(self.user_key),
            "launch.slurm.ssh.known_hosts_file": str(self.known_hosts),
        }

    def restore(self, timeout: float = 20.0) -> None:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        log = open(self.folder / "sshd.log", "ab")
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LoginNodeUnavailable(f"sshd ended: {(self.folder / 'sshd.log').read_text()[-800:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise LoginNodeUnavailable(f"sshd did not listen on port {self.port} within {timeout:.0f} s")

    def cut(self) -> None:
        """Stop the server and every session of it (sshd's children hold the open connections)."""
        if self.process is None:
            return
        for child in psutil.Process(self.process.pid).children(recursive=True):
            child.terminate()
        self.process.terminate()
        self.process.wait(timeout=20)
        self.process = None

    def stop(self) -> None:
        self.cut()
        shutil.rmtree(self.folder, ignore_errors=True)
