"""sky.yaml as SkyPilot itself reads it, for every preset: its own loader (sky.Task.from_yaml, which validates
against SkyPilot's task schema) in SkyPilot's venv (tests/sky/sky_env.py), no API server and no cloud asked.

What SkyPilot made of each task is compared with the job: nodes = launch.num_machines, each node the job's processes
per machine in GPUs of the type asked (CPU jobs: that many cores), the bundle as workdir, requirements.txt installed
by setup, launch.sh run by run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.spec.presets import load_presets

from .sky_env import SkyUnavailable, sky_python

PARSE = Path(__file__).with_name("parse_tasks.py")
# Beyond the presets: several machines, several GPU types, every resource field set.
VARIANTS = {
    "two-nodes": ("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8"]),
    "every-field": (
        "7b-lora-ddp",
        [
            "launch.skypilot.infra=k8s/my-context",
            "launch.skypilot.accelerators=H100, A100-80GB",
            "launch.skypilot.use_spot=true",
            "launch.skypilot.disk_size=500",
            "launch.skypilot.name=my-finetune",
        ],
    ),
    "aws-region": ("70b-qlora-zero3", ["launch.skypilot.infra=aws/us-east-1"]),
}


@pytest.fixture(scope="module")
def skypilot() -> Path:
    try:
        return sky_python()
    except SkyUnavailable as exc:
        # CI installs it (dev.sh): there a missing SkyPilot fails, never skips.
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(f"no SkyPilot to ask: {exc}")
        raise


def read_by_skypilot(skypilot: Path, folders: list[Path], home: Path) -> list[dict]:
    env = {**os.environ, "HOME": str(home)}  # importing sky writes ~/.sky: a HOME of the test's own
    argv = [str(skypilot), str(PARSE), *map(str, folders)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_every_preset_and_variant_parses_as_the_job_it_is(skypilot, tmp_path):
    jobs = {name: (name, []) for name in sorted(load_presets())} | VARIANTS
    specs, folders = {}, []
    for name, (preset, overrides) in jobs.items():
        specs[name] = resolve_spec(preset, overrides)
        write_bundle(render_bundle(specs[name]), tmp_path / name)
        folders.append(tmp_path / name)
    tasks = read_by_skypilot(skypilot, folders, tmp_path / "home")
    assert len(tasks) == len(jobs)
    for task in tasks:
        name = Path(task["folder"]).name
        spec, launch = specs[name], specs[name].launch
        assert "error" not in task, f"{name}: SkyPilot refused sky.yaml: {task.get('error')}"
        assert task["num_nodes"] == launch.num_machines, name
        assert task["workdir"] == "." and "pip install -r requirements.txt" in task["setup"]
        assert "exec bash launch.sh" in task["run"]
        per_node = launch.processes_per_machine
        for resources in task["resources"]:
            if launch.use_cpu:
                assert resources["accelerators"] is None and resources["cpus"] == f"{per_node}+", name
            else:
                assert list(resources["accelerators"].values()) == [per_node], name
        if not launch.use_cpu:
            asked = [r["accelerators"] for r in task["resources"]]
            assert asked == [{gpu.split(":")[0]: per_node} for gpu in launch.skypilot.accelerators], name
        assert task["name"] == (spec.launch.skypilot.name or f"tunedeck-{spec.method}-{spec.strategy.kind}")
    every = next(t for t in tasks if t["folder"].endswith("every-field"))
    assert {(r["infra"], r["use_spot"], r["disk_size"]) for r in every["resources"]} == {
        ("kubernetes/my-context", True, 500)
    }
    assert next(t for t in tasks if t["folder"].endswith("aws-region"))["resources"][0]["infra"] == "aws/us-east-1"
