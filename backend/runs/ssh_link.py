"""One OpenSSH connection to a cluster's login node, shared by every command a run sends there.

Every call goes through a ControlMaster (ControlPersist keeps it open 10 minutes after the last use),
so a page that follows a run every few seconds opens no new connection per tick. The remote side gets
one string, `shlex.join(argv)`: each argument quoted for the remote shell, so a value is always one
word of data. Host keys must already be known (StrictHostKeyChecking=yes: never accepted unseen), no
password is ever asked (BatchMode), and exit code 255 (ssh's own failure) is told apart from the
remote command's failure: it is SshUnreachable, which callers show as "cannot reach HOST", never as a
failed run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10
SSH_FAILED = 255  # ssh's exit code when it, not the remote command, failed
CONTROL_PERSIST_S = 600


class SshUnreachable(Exception):
    """ssh itself failed (no route, refused, host key, authentication) or did not answer in time."""


@dataclass(frozen=True)
class SshLink:
    host: str
    user: str | None = None
    port: int = 0
    identity_file: str | None = None
    known_hosts_file: str | None = None

    @classmethod
    def from_spec(cls, ssh) -> SshLink:
        """From launch.slurm.ssh (backend/spec/slurm_ssh.py)."""
        return cls(ssh.host, ssh.user, ssh.port, ssh.identity_file, ssh.known_hosts_file)

    @classmethod
    def from_record(cls, record: dict) -> SshLink:
        """From the `ssh` entry a submitted run keeps in status.json."""
        return cls(
            str(record["host"]),
            record.get("user"),
            int(record.get("port") or 0),
            record.get("identity_file"),
            record.get("known_hosts_file"),
        )

    def record(self) -> dict:
        return asdict(self)

    @property
    def name(self) -> str:
        """How a person names the login node: user@host:port, as given."""
        who = f"{self.user}@" if self.user else ""
        return f"{who}{self.host}" + (f":{self.port}" if self.port else "")

    def options(self) -> list[str]:
        control = _control_folder()
        options = [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=2",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={control}/%C",
            "-o",
            f"ControlPersist={CONTROL_PERSIST_S}",
        ]
        if self.port:
            options += ["-p", str(self.port)]
        if self.user:
            options += ["-l", self.user]
        if self.identity_file:
            options += ["-i", os.path.expanduser(self.identity_file), "-o", "IdentitiesOnly=yes"]
        if self.known_hosts_file:
            options += ["-o", f"UserKnownHostsFile={os.path.expanduser(self.known_hosts_file)}"]
        return options

    def argv(self, remote: list[str]) -> list[str]:
        """The local argv that runs `remote` on the login node; `--` ends ssh's options before the host."""
        return ["ssh", *self.options(), "--", self.host, shlex.join(remote)]

    def run(
        self, remote: list[str], *, data: bytes | None = None, timeout: float = TIMEOUT_S
    ) -> subprocess.CompletedProcess:
        """Run `remote` there; its stdout and stderr as bytes. SshUnreachable when ssh itself failed."""
        try:
            done = subprocess.run(
                self.argv(remote),
                input=data,
                stdin=None if data is not None else subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
            )
        except FileNotFoundError:
            raise SshUnreachable("ssh (OpenSSH's client) is not installed here") from None
        except subprocess.TimeoutExpired:
            raise SshUnreachable(f"{self.name} did not answer within {timeout:.0f} s") from None
        if done.returncode == SSH_FAILED:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise SshUnreachable(f"{self.name}: {said[-1] if said else 'ssh failed'}")
        return done

    def close(self) -> None:
        """End the shared connection (the next call opens a new one)."""
        subprocess.run(
            ["ssh", *self.options(), "-O", "exit", "--", self.host],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT_S,
        )


def _control_folder() -> str:
    """A folder of this user's own for the control sockets (short: a socket path has at most 107 bytes)."""
    folder = Path(tempfile.gettempdir()) / f"tunedeck-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return str(folder)
