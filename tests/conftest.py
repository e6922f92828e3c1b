"""Fixtures shared by every part of the suite, and the guard of the fast lane.

The demo model, tokenizer and data are built once per machine (deterministically, no
downloads) and cached under $TUNEDECK_HOME/demo (default ~/.cache/tunedeck/demo), so a
second test session does not rebuild them.

The fast lane (`bash dev.sh test-fast`) leaves out the tests marked `integration` (real
multi-process runs) and `browser` (Chromium). A test that starts either without its marker
fails: a watcher looks for launchers and browsers, and knows the test that started one by a tag
in its environment (inherited also by detached processes and a run's supervisor), or, for a
process started with an environment of its own, by being a descendant of this session.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_TAG = "TUNEDECK_TEST_TAG"
# What needs a marker: (marker, pattern over a process's command line). A launcher counts when
# Python runs it (the hostile tests' stand-in `accelerate` is a shell script that starts nothing).
_PYTHON = r"^\S*python[\d.]* (?:-\S+ )*"
NEEDS_MARKER = [
    (
        "integration",
        re.compile(
            _PYTHON
            + r"(?:(?:\S*/)?(?:accelerate launch|torchrun)\b|-m (?:accelerate\.commands\.launch|torch\.distributed\.run)\b)"
        ),
    ),
    ("browser", re.compile(r"^\S*(?:chromium|chrome|headless_shell)\S*(?: |$)")),
]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])  # the name before ")" may hold spaces


def _command(pid: int | str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()


PYTEST = re.compile(r"(?:^| )-m ?pytest(?: |$)|(?:^|/)py\.?test(?: |$)")


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether pid was started by ancestor, and not by a pytest session of its own in between."""
    while pid > 1:
        pid = _parent(pid)
        if pid == ancestor:
            return True
        if PYTEST.search(_command(pid)):
            return False
    return False


def _test_tag(pid: int) -> str | None:
    """The test tag in the environment of pid or of its nearest ancestor that has one (Chromium starts
    its helper processes later, with an emptied environment, from the browser a test started)."""
    while pid > 1:
        with open(f"/proc/{pid}/environ", "rb") as f:
            tag = re.search(rb"(?:^|\0)" + TEST_TAG.encode() + rb"=([^\0]*)", f.read())
        if tag:
            return tag.group(1).decode()
        pid = _parent(pid)
        if pid == os.getpid() or PYTEST.search(_command(pid)):
            return None  # a tag there is the session's, not a test's
    return None


class ProcessWatcher(threading.Thread):
    """Every 0.3 s, the processes whose command line needs a marker, by the tag of the test that started them."""

    def __init__(self):
        super().__init__(name="tunedeck-process-watcher", daemon=True)
        self.seen: dict[str, set[tuple[str, str]]] = {}  # tag -> {(marker, command line)}
        self.owners: dict[tuple[str, str], str] = {}  # (pid, command line) -> tag, fixed when first seen
        self.current = ""  # the tag of the test running now
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(0.3):
            self.scan()

    def scan(self):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                command = _command(pid)
                for marker, pattern in NEEDS_MARKER:
                    if pattern.search(command):
                        tag = _test_tag(int(pid))
                        if tag:
                            owner = tag
                        elif descends_from(int(pid), os.getpid()):
                            owner = self.owners.setdefault((pid, command), self.current)
                        else:
                            continue  # another session's
                        self.seen.setdefault(owner, set()).add((marker, command[:200]))
            except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
                continue


def pytest_configure(config):
    if os.path.isdir("/proc/self"):
        config._process_watcher = ProcessWatcher()
        config._process_watcher.start()


def pytest_unconfigure(config):
    watcher = getattr(config, "_process_watcher", None)
    if watcher is not None:
        watcher.stopped.set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    os.environ[TEST_TAG] = f"{os.getpid()} {item.nodeid}"  # before any fixture of this test starts a process
    watcher = getattr(item.config, "_process_watcher", None)
    if watcher is not None:
        watcher.current = os.environ[TEST_TAG]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.failed_here = True  # the page fixture's screenshot reads it
    watcher = getattr(item.config, "_process_watcher", None)
    if call.when != "teardown" or watcher is None or not report.passed:
        return
    watcher.scan()
    unmarked = sorted(
        (m, c) for m, c in watcher.seen.get(f"{os.getpid()} {item.nodeid}", ()) if item.get_closest_marker(m) is None
    )
    if unmarked:
        started = "\n".join(f"  {command}  -> needs @pytest.mark.{marker}" for marker, command in unmarked)
        report.outcome = "failed"
        report.longrepr = f"this test started processes the fast lane leaves out, without their marker:\n{started}"


@pytest.fixture(scope="session")
def demo_home() -> Path:
    """The built demo folder: model/, data/train.jsonl, data/eval.jsonl, formats/<format>.jsonl."""
    from tunedeck.backend.data.demo import ensure_demo

    return ensure_demo()


@pytest.fixture
def demo_spec(demo_home):
    """Factory: the demo preset's JobSpec with dotted-path overrides, e.g. demo_spec({"training.max_steps": 3})."""
    from tunedeck.backend.spec import resolve_spec, set_paths

    def make(overrides: dict | None = None):
        spec = resolve_spec("demo")
        return set_paths(spec, overrides) if overrides else spec

    return make


@pytest.fixture
def runs_dir(tmp_path) -> Iterator[Path]:
    """An empty runs folder for this test; a run a failing test left training there is killed after it."""
    path = tmp_path / "runs"
    path.mkdir()
    yield path
    _kill_runs_under(path)  # left alive, its ranks would slow every later test down


def _kill_runs_under(folder: Path) -> None:
    import psutil

    left = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        where = " ".join(process.info["cmdline"] or []) + " " + (process.info["cwd"] or "")
        if str(folder) in where and process.pid != os.getpid():
            left.append(process)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local 2-node Slurm cluster (tests/slurm/local_cluster.py), once per session; SLURM_CONF points at it.

    Tests that use it are marked `slurm`. They skip only where its Debian packages cannot be
    installed (or run: slurmd needs root); a cluster that fails to start fails them.
    """
    from tunedeck.tests.slurm.local_cluster import ClusterUnavailable, LocalCluster, install_packages

    # CI runs as root with apt: there a missing cluster is a failure, never a skip that hides it.
    unavailable = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
    if os.geteuid() != 0:
        unavailable("no local Slurm cluster: slurmd and munged need root")
    try:
        install_packages()
    except ClusterUnavailable as exc:
        unavailable(f"no local Slurm cluster: {exc}")
    cluster = LocalCluster().start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # every sbatch/squeue/scancel of the session, the panel's too
    try:
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="session")
def login_node(slurm_cluster):
    """The cluster's login node: OpenSSH's server on 127.0.0.1 (tests/slurm/login_node.py), its sessions
    pointed at the local cluster; one per session."""
    from tunedeck.tests.slurm.login_node import LoginNode

    node = LoginNode(slurm_cluster.conf)
    yield node
    node.stop()


@pytest.fixture(scope="session")
def shared_runs_dir(tmp_path_factory) -> Path:
    """A runs folder both nodes see: not under /tmp (same host here, but the node-local warning looks at the path)."""
    base = Path(os.environ.get("TUNEDECK_SHARED_TMP", "/var/tmp"))
    folder = base / f"tunedeck-slurm-runs-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the browser tests' Chromium


@pytest.fixture(scope="session")
def browser():
    """One Chromium for the whole session: a second sync Playwright in the same thread cannot start."""
    from panel.browser import CHROMIUM, CHROMIUM_FLAGS
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (bash dev.sh test does)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request):
    from panel.browser import ARTIFACTS, EVENTS_TAP_JS

    context = browser.new_context(viewport={"width": 1600, "height": 1200}, accept_downloads=True)
    context.add_init_script(EVENTS_TAP_JS)  # so a test can settle(page): wait for every response it asked for
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    # The page as the test left it, to look at; in CI only a failed test's (a full-page screenshot of every test took
    # tens of seconds of CI's page lane, and no one sees them there).
    try:
        if os.environ.get("CI") != "true" or getattr(request.node, "failed_here", False):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    finally:
        context.close()
