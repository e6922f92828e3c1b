"""The wheel is complete and polite: installed (not editable) into a fresh venv that cannot see this
repository, the `tunedeck` command lists the presets, exports a bundle, estimates and serves the
panel from a folder outside the repository, and the wheel claims no generic top-level names.

The fresh venv gets the training stack and Gradio by a .pth file that points at the
site-packages of the interpreter running the tests (installing them afresh takes minutes and needs
an index). A folder listed in a .pth file does not have its own .pth files run, so an editable
install of this repository there stays switched off; the tests check where `tunedeck` comes from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest
from panel.browser import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
ANYWHERE = shutil.ignore_patterns(".*", "*.egg-info", "__pycache__")
TOP_LEVEL = {"build", "dist", "tests", "runs", "test-artifacts"}  # at the top only: backend/runs/ is a package


def not_sources(folder: str, names: list[str]) -> set[str]:
    return ANYWHERE(folder, names) | (TOP_LEVEL & set(names) if Path(folder) == REPO else set())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (a build in place could ship stale build/ files)."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, work / "src", ignore=not_sources)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run([*pip_wheel, "-w", work / "dist", work / "src"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # Our own packaging warns of nothing (a fresh `bash dev.sh demo` printed two walls of "absent from the
    # packages configuration" for presets/ and assets/demo/).
    assert "BuildBackendWarning" not in built.stdout + built.stderr, built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("tunedeck-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """A fresh venv holding the wheel, and an environment and folder that know nothing of the repository."""
    root = tmp_path_factory.mktemp("installed")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", where], text=True).strip())
    stack = dict.fromkeys(path for path in sys.path if path.endswith("site-packages"))  # ours, and any it adds
    (site / "zz_training_stack.pth").write_text("".join(f"{path}\n" for path in stack))
    outside = root / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {"python": python, "tunedeck": env_dir / "bin" / "tunedeck", "site": site, "cwd": outside, "env": env}


def run(installed, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=installed["cwd"],
        env=installed["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_wheel_holds_the_package_data_and_only_tunedeck(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
    assert {n.split("/")[0] for n in names} == {"tunedeck", info}  # no top-level app/, backend/, tests/
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split() == ["tunedeck"]
    shipped_data = [*REPO.glob("presets/*.yaml"), *(p for p in REPO.glob("assets/**/*") if p.is_file())]
    assert shipped_data and REPO / "assets/demo/recipe.yaml" in shipped_data
    recipe = sorted(REPO.glob("backend/recipe/*.py"))  # the training recipe every bundle carries
    assert REPO / "backend/recipe/train_sft.py" in recipe
    for path in [*shipped_data, REPO / "constraints.txt", REPO / "__main__.py", *recipe]:
        assert f"tunedeck/{path.relative_to(REPO)}" in names, path
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "tunedeck = tunedeck.__main__:main" in entry_points


def test_the_installed_package_is_the_wheel_and_claims_no_generic_names(installed):
    probe = (
        "import importlib.util, json, tunedeck, tunedeck.backend.spec as spec\n"
        "print(json.dumps([tunedeck.__file__, str(spec.PRESETS_DIR),"
        " [n for n in ('app', 'backend', 'presets', 'assets') if importlib.util.find_spec(n)]]))"
    )
    result = run(installed, installed["python"], "-c", probe)
    assert result.returncode == 0, result.stderr
    package, presets, generic = json.loads(result.stdout)
    assert Path(package).parent == installed["site"] / "tunedeck"
    assert Path(presets) == installed["site"] / "tunedeck" / "presets"
    assert generic == []


def test_presets_export_and_estimate_from_outside_the_repository(installed):
    assert REPO not in installed["cwd"].parents
    listed = run(installed, installed["tunedeck"], "presets")
    assert listed.returncode == 0, listed.stderr
    for preset in REPO.glob("presets/*.yaml"):
        assert preset.stem in listed.stdout

    exported = run(installed, installed["tunedeck"], "export", "7b-lora-ddp", "-o", "bundle")
    assert exported.returncode == 0, exported.stderr
    bundle = installed["cwd"] / "bundle"
    assert "tunedeck_recipe.train_sft import main" in (bundle / "train_sft.py").read_text()
    for path in REPO.glob("backend/recipe/*.py"):  # the recipe as the wheel installed it: this checkout's
        assert (bundle / "tunedeck_recipe" / path.name).read_text() == path.read_text(), path.name
    pins = {
        line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith(("trl==", "torch=="))
    }
    assert len(pins) == 2 and pins <= set((bundle / "requirements.txt").read_text().splitlines())

    estimated = run(installed, installed["tunedeck"], "estimate", "7b-lora-ddp", "--gpu-mem", "80", "--json")
    assert estimated.returncode == 0, estimated.stderr
    assert json.loads(estimated.stdout)["recommended"]


def test_the_panel_starts_from_outside_the_repository(installed, demo_home, tmp_path):
    port = free_port()
    log = (tmp_path / "panel.log").open("w")
    panel = subprocess.Popen(
        [str(installed["tunedeck"]), "ui", "--port", str(port), "--runs-dir", "runs", "--preset", "demo"],
        cwd=installed["cwd"],
        env=installed["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        page = wait_for_page(f"http://127.0.0.1:{port}/", panel, deadline=time.monotonic() + 240)
        assert page is not None, (tmp_path / "panel.log").read_text()
        status, body = page
        assert status == 200 and "tunedeck" in body.lower()
    finally:
        os.killpg(panel.pid, signal.SIGTERM)
        panel.wait(timeout=60)
        log.close()
    assert (installed["cwd"] / "runs").is_dir()  # the panel's runs folder, relative to where it started


def wait_for_page(url: str, panel: subprocess.Popen, deadline: float) -> tuple[int, str] | None:
    while time.monotonic() < deadline and panel.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode(errors="replace")
        except OSError:
            time.sleep(0.5)
    return None


def test_a_bundle_exported_from_the_wheel_trains_the_demo_where_tunedeck_cannot_be_imported(installed, demo_home):
    """The bundle carries its recipe (tunedeck_recipe/ beside train_sft.py): exported by the installed wheel, its
    launch.sh trains the demo on 2 CPU processes with packages named like tunedeck's that refuse to be imported."""
    bundle = installed["cwd"] / "demo-bundle"
    steps = ["--set", "training.max_steps=2", "--set", "training.save_steps=2", "--set", "training.eval_steps=2"]
    exported = run(installed, installed["tunedeck"], "export", "demo", *steps, "-o", bundle)
    assert exported.returncode == 0, exported.stderr
    poison = installed["cwd"] / "poison"
    for package in ("backend", "app", "tunedeck"):
        (poison / package).mkdir(parents=True)
        (poison / package / "__init__.py").write_text("raise ImportError('the bundle must not import tunedeck')\n")
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",  # accelerate, from the training stack
        "HOME": os.environ.get("HOME", str(installed["cwd"])),
        "PYTHONPATH": str(poison),
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        ["bash", str(bundle / "launch.sh")], cwd=installed["cwd"], env=env, capture_output=True, text=True, timeout=400
    )
    logs = "".join(log.read_text(errors="replace")[-2000:] for log in sorted((bundle / "logs").glob("rank*.log")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs
    records = [json.loads(line) for line in (bundle / "metrics.jsonl").read_text().splitlines()]
    start, end = records[0], records[-1]
    assert start["event"] == "start" and start["world_size"] == 2 and start["gate"]["passed"]
    assert [r["step"] for r in records if r["event"] == "log" and "loss" in r] == [1, 2]
    assert end["event"] == "end" and end["status"] == "finished"
    assert (bundle / "output" / "adapter_model.safetensors").is_file()
