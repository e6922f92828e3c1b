"""What a rank log shows: each library warning once, though the stack resets Python's own memory of it every step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import warnings
    from tunedeck.backend.recipe import show_each_warning_once

    def collective():  # what DeepSpeed's ZeRO-3 calls every step
        warnings.warn("`reduce_scatter_tensor` is deprecated", FutureWarning)

    if "--once" in __import__("sys").argv:
        show_each_warning_once()
    for step in range(5):
        collective()
        with warnings.catch_warnings():  # the trainer's step does this: it clears the once-per-place record
            pass
    warnings.warn("another warning", UserWarning)
    """
)


def warnings_printed(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return [line for line in result.stderr.splitlines() if "Warning:" in line]


def test_a_warning_raised_every_step_is_printed_once():
    assert len(warnings_printed()) == 6  # Python alone: once per step, five times
    once = warnings_printed("--once")
    assert [line.split("Warning: ")[1] for line in once] == ["`reduce_scatter_tensor` is deprecated", "another warning"]
