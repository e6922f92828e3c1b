"""SkyPilot in a virtual environment of its own (.venv/sky), for the tests that ask SkyPilot itself.

SkyPilot 0.14.1 pins click 8.1.8 and uvicorn 0.35, older than the panel's (8.5.1, 0.55: `pip install --dry-run
-c constraints.txt skypilot==0.14.1` in .venv downgrades both), so it gets a venv beside .venv, made once per machine
from the same Python (about 40 s here). `python tests/sky/sky_env.py` makes it ahead of the tests (dev.sh can run it
while other things install); a lock keeps two test workers from making it twice.

    python tests/sky/sky_env.py        # make it when missing; prints its python
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

SKYPILOT = "skypilot==0.14.1"
VENV = Path(__file__).resolve().parents[2] / ".venv" / "sky"
STAMP = VENV / ".tunedeck-installed"


class SkyUnavailable(Exception):
    """Why SkyPilot cannot be installed here (the tests skip with it, or fail in CI)."""


def sky_python() -> Path:
    """The python of a venv holding SkyPilot, made when missing."""
    python = VENV / "bin" / "python"
    if STAMP.exists() and STAMP.read_text() == SKYPILOT:
        return python
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "sky.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if STAMP.exists() and STAMP.read_text() == SKYPILOT:  # another worker made it meanwhile
            return python
        base = getattr(sys, "_base_executable", sys.executable)  # the interpreter under .venv, not .venv's own
        for argv in ([base, "-m", "venv", str(VENV)], [str(python), "-m", "pip", "install", "-q", SKYPILOT]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if done.returncode:
                raise SkyUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-600:]}")
        STAMP.write_text(SKYPILOT)
    return python


if __name__ == "__main__":
    print(sky_python())
