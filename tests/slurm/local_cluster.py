"""A real 2-node Slurm cluster on this one machine, for the Slurm tests (measured recipe:
/work/shared/notes/slurm-local.md in the project's notes, issue 13).

    python tests/slurm/local_cluster.py      # start it, print SLURM_CONF, stop it on Enter

Debian's slurmctld, slurmd, slurm-client and munge (installed with apt-get when missing, as
root) give two nodes, n0 and n1, on this host: munged (only when none answers), slurmctld,
then `slurmd -N n0` and `slurmd -N n1`, each in the foreground as our own child, with the
configuration in a temporary folder (`SLURM_CONF` points at it: the machine's own
/etc/slurm is left alone). The node names are added to /etc/hosts when they do not
resolve: torch's rendezvous on the allocation's first node needs them, and without them both
nodes hang silently until the time limit. `stop()` ends exactly the daemons this object
started. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runs.helpers import files_tail

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
COMMANDS = ["slurmctld", "slurmd", "sbatch", "munged"]
NODES = ("n0", "n1")
CPUS_PER_NODE = 2
HOSTS_FILE = Path("/etc/hosts")


class ClusterUnavailable(Exception):
    """Why no local Slurm cluster can run here (the tests skip with this reason)."""


def _missing_commands() -> list[str]:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in COMMANDS if shutil.which(name, path=search) is None]


def install_packages() -> None:
    """apt-get install the Debian packages when a command is missing; ClusterUnavailable when that is impossible."""
    missing = _missing_commands()
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"{', '.join(missing)} missing and not root: apt-get install -y {' '.join(PACKAGES)}")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"{', '.join(missing)} missing and no apt-get to install {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise ClusterUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-400:]}")
    if _missing_commands():
        raise ClusterUnavailable(f"still missing after apt-get: {', '.join(_missing_commands())}")


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free now on every address, as the daemons bind them (held together while chosen:
    one port released could be handed out again)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in sockets]


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


def ensure_hosts() -> None:
    """Add `127.0.0.1 n0 n1` to /etc/hosts for the node names that do not resolve."""
    missing = [name for name in NODES if not _resolves(name)]
    if not missing:
        return
    try:
        with HOSTS_FILE.open("a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(missing)}  # tunedeck's local Slurm test cluster\n")
    except OSError as exc:
        raise ClusterUnavailable(
            f"the node names {missing} do not resolve and {HOSTS_FILE} cannot be written: {exc}"
        ) from None


def slurm_conf(folder: Path, host: str, ctld_port: int, node_ports: list[int], kill_wait_s: int) -> str:
    lines = [
        "ClusterName=tunedeck-test",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        f"KillWait={kill_wait_s}",  # seconds between SIGTERM and SIGKILL when a job ends (cancel, time limit)
        "SchedulerParameters=sched_interval=2",
        "MinJobAge=300",  # how long `scontrol show job` remembers an ended job
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool' / '%n'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
    ]
    for name, port in zip(NODES, node_ports):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} RealMemory=8000 State=UNKNOWN"
        )
    lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


class LocalCluster:
    """Start with start(), end with stop(); `env` is what a Slurm client command needs (SLURM_CONF)."""

    def __init__(self, kill_wait_s: int = 30):
        self.kill_wait_s = kill_wait_s
        self.folder: Path | None = None
        self._daemons: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        assert self.folder is not None, "start() first"
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0, attempts: int = 3) -> LocalCluster:
        install_packages()
        ensure_hosts()
        for _ in range(attempts - 1):
            try:
                return self._start(timeout)
            except ClusterUnavailable as exc:
                # A port chosen free can be taken before a daemon binds it (seen here: slurmd's, now and then).
                if "Address already in use" not in str(exc):
                    raise
        return self._start(timeout)

    def _start(self, timeout: float) -> LocalCluster:
        self.folder = Path(tempfile.mkdtemp(prefix="tunedeck-slurm-"))
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir()
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        self.conf.write_text(slurm_conf(self.folder, socket.gethostname(), ctld_port, node_ports, self.kill_wait_s))
        try:
            self._start_munge()
            self._spawn(["slurmctld", "-D", "-i"], "slurmctld.out")
            self._wait(lambda: self._run(["scontrol", "ping"]).returncode == 0, timeout, "slurmctld to answer")
            for name in NODES:
                self._spawn(["slurmd", "-D", "-N", name], f"slurmd-{name}.out")
            self._wait(lambda: self.idle_nodes() == len(NODES), timeout, "both nodes to be idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        if self._munge_answers():
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(KeyError, OSError):
            shutil.chown("/run/munge", "munge", "munge")
        self._spawn(["munged", "-F", "--force"], "munged.out")
        self._wait(self._munge_answers, 20, "munged to answer")

    @staticmethod
    def _munge_answers() -> bool:
        try:
            encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
            return (
                encoded.returncode == 0
                and subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _spawn(self, argv: list[str], log_name: str) -> None:
        assert self.folder is not None
        with open(self.folder / log_name, "ab") as log:
            self._daemons.append(
                subprocess.Popen(
                    argv,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)

    def idle_nodes(self) -> int:
        done = self._run(["sinfo", "-h", "-N", "-o", "%N %t"])
        return sum(1 for line in done.stdout.splitlines() if line.split()[1:] == ["idle"])

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self._daemons if p.poll() is not None]
            if dead:
                raise ClusterUnavailable(f"{', '.join(dead)} exited at start:\n{self._log_tails()}")
            if ready():
                return
            time.sleep(0.5)
        raise ClusterUnavailable(f"timed out after {timeout:.0f} s waiting for {what}:\n{self._log_tails()}")

    def _log_tails(self) -> str:
        """The end of each daemon's log: the folder is removed when a start fails, and CI keeps only the message."""
        assert self.folder is not None
        return files_tail(sorted(self.folder.glob("*.out")), lines=15)

    def cancel_all(self) -> None:
        """Cancel every job of this cluster (between tests: a job left behind would hold the nodes)."""
        self._run(["scancel", "--partition=debug"])

    def stop(self) -> None:
        """End exactly the daemons this object started (slurmds first, munged last)."""
        if self._daemons and self._run(["scontrol", "ping"]).returncode == 0:
            self.cancel_all()
        for proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._daemons.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    try:
        cluster = LocalCluster().start()
    except ClusterUnavailable as exc:
        sys.exit(f"no local Slurm cluster: {exc}")
    print(f"export SLURM_CONF={cluster.conf}\n(Enter stops the cluster)", flush=True)
    try:
        input()
    finally:
        cluster.stop()
