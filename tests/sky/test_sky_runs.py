"""launch.backend=skypilot against SkyPilot itself (its venv: tests/sky/sky_env.py), on a machine with no infra
SkyPilot can use (docs/clusters.md says why the local Slurm cluster is none): Start is refused before anything is
submitted, naming the field and `sky check`, and the run folder is removed; every state SkyPilot's managed jobs
can be in has a line in sky_runs.STATES. SkyPilot's API server runs in a HOME of the test's own and is stopped."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.runs import sky_runs
from tunedeck.backend.runs.status import RunError
from tunedeck.backend.spec import resolve_spec

from .test_sky_yaml import skypilot  # noqa: F401 - the fixture


@pytest.fixture
def sky_home(skypilot, tmp_path, monkeypatch):  # noqa: F811
    """SkyPilot on PATH, with a HOME of its own whose config allows only Kubernetes, which has no kubeconfig."""
    home = tmp_path / "home"
    (home / ".sky").mkdir(parents=True)
    (home / ".sky" / "config.yaml").write_text("allowed_clouds: [kubernetes]\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(sky_runs.SKY_PYTHON_ENV, str(skypilot))
    yield home
    sky = str(skypilot.with_name("sky"))
    subprocess.run([sky, "api", "stop"], capture_output=True, timeout=120)  # the server the check started


def run_folder(tmp_path, overrides=()):
    spec = resolve_spec("demo", ["launch.backend=skypilot", *overrides])
    folder = tmp_path / "runs" / "20261206-000000-abcdef"
    write_bundle(render_bundle(spec), folder)
    return spec, folder


@pytest.mark.slow  # starts SkyPilot's API server: about 40 s
def test_no_enabled_infra_refuses_start_naming_the_field_and_sky_check(sky_home, tmp_path, demo_home):
    from tunedeck.backend.runs import RunManager

    runs = tmp_path / "runs"
    with pytest.raises(RunError) as refused:  # Start, as the page and `tunedeck train` call it
        RunManager(runs).start(resolve_spec("demo", ["launch.backend=skypilot"]))
    assert [p.field for p in refused.value.problems] == ["launch.skypilot.infra"]
    assert "no infra enabled" in str(refused.value) and "sky check" in str(refused.value)
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []  # nothing written, nothing submitted


def test_without_skypilot_start_is_refused_naming_the_backend(tmp_path, monkeypatch):
    monkeypatch.delenv(sky_runs.SKY_PYTHON_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    spec, folder = run_folder(tmp_path)
    with pytest.raises(RunError) as refused:
        sky_runs.check_before_submit(spec, folder)
    assert [p.field for p in refused.value.problems] == ["launch.backend"]
    assert "`sky` is not on PATH" in str(refused.value) and not folder.exists()


def test_every_managed_job_state_of_skypilot_has_a_line(skypilot, tmp_path):  # noqa: F811
    program = "import json; from sky.jobs.state import ManagedJobStatus as S; print(json.dumps([s.value for s in S]))"
    env = {**os.environ, "HOME": str(tmp_path)}  # importing sky writes ~/.sky
    done = subprocess.run([str(skypilot), "-c", program], capture_output=True, text=True, env=env, timeout=120)
    states = json.loads(done.stdout)
    assert set(states) <= set(sky_runs.STATES), set(states) - set(sky_runs.STATES)
    # Provisioning is never a failure (transformerlab-app#1446): waiting states are queued, with what is happening.
    for name in ("PENDING", "STARTING"):
        state, line = sky_runs.STATES[name]
        assert state == "queued" and line.startswith("provisioning")
