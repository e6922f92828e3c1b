"""Shared by the hostile-input tests: the CLI in-process, the console script, and stand-in launchers.

The stand-ins replace only what cannot run here or would train for minutes: `accelerate`
(launch.sh runs "${ACCELERATE:-accelerate}"), and Slurm's `srun` and `scontrol`. Each records
the argv it received, NUL-separated, so a test can compare it with the spec byte for byte.
Everything around them is real: bash running the bundle's own launch.sh and slurm.sbatch.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from tunedeck.backend.cli import main

TUNEDECK = str(Path(sys.executable).parent / "tunedeck")
# What no message the CLI or the page shows may contain: a traceback, or Python's own words.
RAW_ERRORS = ("Traceback", "RecursionError", "set_int_max_str_digits", "embedded null", "Unexpected")

ACCELERATE = """#!/usr/bin/env bash
# stand-in for accelerate: record argv (NUL-separated), the working folder and the job's probe variable
# (launch.env), start nothing.
printf '%s\\0' "$@" > "$ARGV_DIR/accelerate-${SLURM_NODEID:-local}"
pwd > "$ARGV_DIR/cwd-${SLURM_NODEID:-local}"
printf '%s' "${PAYLOAD_PROBE-unset}" > "$ARGV_DIR/env-${SLURM_NODEID:-local}"
"""

SRUN = """#!/usr/bin/env bash
# stand-in for srun -N2: run the last argument with bash once per node, like srun on an allocation.
status=0
for node in 0 1; do SLURM_NODEID=$node bash -c "${@: -1}" || status=$?; done
exit $status
"""

SCONTROL = """#!/usr/bin/env bash
# stand-in for `scontrol show hostnames`: the allocation's node names, first one first.
[ "$1 $2" = "show hostnames" ] && printf 'node-a\\nnode-b\\n'
"""


def cli(*argv: str) -> tuple[int, str, str]:
    """tunedeck.backend.cli.main in-process: (exit code, stdout, stderr). Any other exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def console(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed `tunedeck` console script, as a user runs it."""
    return subprocess.run([TUNEDECK, *argv], capture_output=True, text=True, cwd=cwd, timeout=120)


def error_fields(stderr: str) -> list[str]:
    """The field named by each `error: FIELD: message` line."""
    return [line.split(": ", 2)[1] for line in stderr.splitlines() if line.startswith("error: ")]


def install_stand_ins(folder: Path) -> Path:
    """Write accelerate, srun and scontrol stand-ins into folder/bin; returns that bin folder."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in {"accelerate": ACCELERATE, "srun": SRUN, "scontrol": SCONTROL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_bundle_scripts(bundle: Path, bin_dir: Path, argv_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run the bundle's launch.sh and slurm.sbatch (from a spool copy, as sbatch does) with the stand-ins."""
    argv_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "ACCELERATE": str(bin_dir / "accelerate"),
        "ARGV_DIR": str(argv_dir),
        "SLURM_SUBMIT_DIR": str(bundle),
        "SLURM_JOB_NODELIST": "node-[a-b]",
    }
    spooled = argv_dir / "spooled.sbatch"
    spooled.write_text((bundle / "slurm.sbatch").read_text())
    return {
        name: subprocess.run(["bash", str(script)], cwd=argv_dir, env=env, capture_output=True, text=True, timeout=60)
        for name, script in (("launch.sh", bundle / "launch.sh"), ("slurm.sbatch", spooled))
    }


def recorded_argv(argv_dir: Path, who: str) -> list[str]:
    return (argv_dir / f"accelerate-{who}").read_bytes().decode().split("\0")[:-1]
