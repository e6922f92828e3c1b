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
from tunedeck.backend.runs.status import RunError, from_status_file
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


def test_a_provisioning_job_is_queued_with_skypilots_words_and_skypilot_is_asked_once_per_interval(
    tmp_path, monkeypatch
):
    """A job SkyPilot is still provisioning reads as queued with its details, never failed; `tunedeck runs` and the
    page read a run's status every second or so, and each question starts SkyPilot's python (seconds): it is asked
    once per ASK_EVERY_S, and at once after a stop request. A managed job on a cloud cannot exist here, so SkyPilot's
    answers come from a stand-in of its python that records each question (the states are SkyPilot's own names,
    checked against its ManagedJobStatus above)."""
    asked = tmp_path / "asked.txt"
    python = tmp_path / "sky-env" / "python"
    python.parent.mkdir()
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$2 $3" >> {asked}\n'
        'case "$2" in\n'
        '  queue) echo \'{"job": {"job_id": 7, "status": "STARTING", "details": "Launching on kubernetes (H100:1)"}}\' ;;\n'
        "  cancel) echo '{\"cancelled\": 7}' ;;\n"
        "esac\n"
    )
    (python.parent / "sky").write_text("#!/bin/sh\necho 'the job log'\n")  # `sky jobs logs --no-follow 7`
    for script in (python, python.parent / "sky"):
        script.chmod(0o755)
    monkeypatch.setenv(sky_runs.SKY_PYTHON_ENV, str(python))
    _, folder = run_folder(tmp_path)
    (folder / sky_runs.LAUNCH_FILE).write_text(json.dumps({"job_id": 7}))  # what the detached launcher writes
    data = {"state": "queued", "backend": "skypilot", "skypilot": {"name": "tunedeck-x", "state": "", "reason": ""}}
    (folder / "status.json").write_text(json.dumps(data))  # as the manager wrote it, with logs/
    (folder / "logs").mkdir()

    first = sky_runs.follow(folder, data)
    assert first["state"] == "queued", first
    assert first["skypilot"]["reason"] == (
        "provisioning: SkyPilot is finding and starting the nodes: Launching on kubernetes (H100:1)"
    )
    again = sky_runs.follow(folder, data)
    assert again["state"] == "queued" and again["skypilot"] == first["skypilot"]
    assert asked.read_text().splitlines() == ["queue 7"]  # the second read did not start SkyPilot
    shown = from_status_file(folder.name, {**data, **again})  # what `tunedeck runs` and the Run tab say
    assert shown.place == "skypilot:7" and shown.where.startswith(
        "SkyPilot job 7 (tunedeck-x) · STARTING · provisioning"
    )
    assert (folder / "logs" / "launcher.log").read_text() == "the job log\n"

    sky_runs.stop(folder, again, grace_s=5)
    assert asked.read_text().splitlines() == ["queue 7", "cancel 7"]
    sky_runs.follow(folder, data)  # a stop request: SkyPilot is asked at once (and, still STARTING, told again)
    assert asked.read_text().splitlines() == ["queue 7", "cancel 7", "queue 7", "cancel 7"]
