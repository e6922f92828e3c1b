"""The fast lane stays fast: a test that starts a launcher or a browser without its marker fails.

Runs a small pytest session under this suite's conftest. The processes are stand-ins with the
command lines the guard looks for (a Python script named `accelerate` run as `accelerate launch`,
a program named `chromium`), so the check takes seconds.
"""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = """
import shutil, subprocess, sys, time
import pytest

# Each stand-in is left running for 3 s: the check at the end of the test sees it (and so does the
# watcher's poll, which is what sees the real launchers and browsers that live for minutes).

def started(*argv, env=None):
    proc = subprocess.Popen(argv, env=env)
    while not open(f"/proc/{proc.pid}/cmdline", "rb").read():  # empty for a moment after the exec
        time.sleep(0.01)

def launcher(tmp_path, env=None):
    script = tmp_path / "accelerate"
    script.write_text("import time; time.sleep(3)")
    started(sys.executable, str(script), "launch", "--num_processes", "2", "train_sft.py", env=env)

def browser(tmp_path):
    program = tmp_path / "chromium"
    shutil.copy("/bin/sleep", program)
    started(str(program), "3")

def test_launcher_unmarked(tmp_path):
    launcher(tmp_path)

@pytest.mark.integration
def test_launcher_marked(tmp_path):
    launcher(tmp_path)

def test_browser_unmarked(tmp_path):
    browser(tmp_path)

@pytest.mark.browser
def test_browser_marked(tmp_path):
    browser(tmp_path)

def test_launcher_with_an_environment_of_its_own(tmp_path):
    launcher(tmp_path, env={"PATH": "/usr/bin:/bin"})

def test_shell_stand_in_is_not_a_launcher(tmp_path):
    stand_in = tmp_path / "accelerate"
    stand_in.write_text("sleep 3")
    started("bash", str(stand_in), "launch")
"""


def test_unmarked_launcher_and_browser_fail_the_test(pytester):
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\nmarkers =\n    integration: x\n    browser: x\n")
    pytester.makepyfile(test_guarded=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 6 and outcomes.get("errors") == 3, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_launcher_unmarked*",
            "*accelerate launch --num_processes 2 *-> needs @pytest.mark.integration*",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_browser_unmarked*", "*chromium 3  -> needs @pytest.mark.browser*"]
    )
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_launcher_with_an_environment_of_its_own*",
            "*accelerate launch --num_processes 2 *-> needs @pytest.mark.integration*",
        ]
    )
