"""Issue 36 part 3: launch.skypilot's values reach SkyPilot as YAML strings of sky.yaml, never as shell text.

sky.yaml's setup and run scripts hold no value of the spec: a shell payload in a SkyPilot field is refused with the
field named, and the run script, run under bash as SkyPilot runs it on a node (its SKYPILOT_* variables set, the
accelerate stand-in of tests/hostile/helpers.py), starts launch.sh with the node's rank and the head's address while
the job's legal text (the model path, launch.env) stays data. tests/sky/test_sky_yaml.py has SkyPilot itself read it.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.spec import resolve_spec

from .helpers import cli, error_fields, install_stand_ins, recorded_argv
from .test_shell_payloads import DANGEROUS, REFUSED

FIELDS = ("infra", "accelerators", "name")


@pytest.mark.parametrize("field", FIELDS)
def test_every_shell_payload_in_a_skypilot_field_is_refused_naming_it(tmp_path, field):
    marker = tmp_path / "PWNED"
    payloads = {**DANGEROUS, **REFUSED, "option": "--infra=aws", "dash": "-x"}
    for kind, template in payloads.items():
        value = template.format(marker=marker)
        job = tmp_path / "one.yaml"
        job.write_text(yaml.safe_dump({"launch": {"backend": "skypilot", "skypilot": {field: value}}}))
        code, _, err = cli("export", str(job), "-o", str(tmp_path / "out"))
        assert code == 2 and error_fields(err) == [f"launch.skypilot.{field}"], (kind, err)
    assert not (tmp_path / "out").exists() and not marker.exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "yes"),
        ("name", "NO"),
        ("name", "on"),
        ("infra", "k8s/aws:eks:us-east-1:123456789012:cluster/x"),
        ("infra", "*"),
    ],
)
def test_values_yaml_would_read_as_something_else_stay_strings(tmp_path, field, value):
    # `name: yes` or `infra: *` unquoted would be YAML 1.1's true, or an alias: safe_dump quotes them.
    spec = resolve_spec("7b-lora-ddp", ["launch.backend=skypilot", f"launch.skypilot.{field}={value}"])
    task = yaml.safe_load(render_bundle(spec)["sky.yaml"])
    assert (task["name"] if field == "name" else task["resources"]["infra"]) == value


def test_the_scripts_hold_no_value_of_the_spec(tmp_path):
    plain = render_bundle(resolve_spec("7b-lora-ddp", ["launch.backend=skypilot"]))["sky.yaml"]
    odd = render_bundle(
        resolve_spec(
            "7b-lora-ddp",
            [
                "launch.backend=skypilot",
                "launch.skypilot.infra=k8s/ctx",
                "launch.skypilot.name=zzz",
                "launch.skypilot.accelerators=L4",
                "model.name_or_path=/m/$(touch x)",
            ],
        )
    )["sky.yaml"]
    scripts = [{k: yaml.safe_load(text)[k] for k in ("setup", "run")} for text in (plain, odd)]
    assert scripts[0] == scripts[1]


def test_the_run_script_starts_launch_sh_with_the_node_rank_and_head_address(tmp_path):
    marker = tmp_path / "PWNED"
    payload = DANGEROUS["command substitution"].format(marker=marker)
    spec = resolve_spec(
        "demo",
        ["launch.num_machines=2", "launch.num_processes=2", f"launch.env=PAYLOAD_PROBE={payload}"],
    )
    bundle, argv_dir = tmp_path / "bundle", tmp_path / "argv"
    write_bundle(render_bundle(spec), bundle)
    bin_dir = install_stand_ins(tmp_path)
    argv_dir.mkdir()
    run = yaml.safe_load((bundle / "sky.yaml").read_text())["run"]
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "ACCELERATE": str(bin_dir / "accelerate"),
        "ARGV_DIR": str(argv_dir),
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_IPS": "10.1.2.3\n10.1.2.4",
        "SLURM_NODEID": "1",  # names the stand-in's record
    }
    done = subprocess.run(["bash", "-c", run], cwd=bundle, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = recorded_argv(argv_dir, "1")
    assert argv[argv.index("--machine_rank") + 1] == "1"
    assert argv[argv.index("--main_process_ip") + 1] == "10.1.2.3"
    assert (argv_dir / "env-1").read_text() == payload and not marker.exists()

    wrong = subprocess.run(
        ["bash", "-c", run], cwd=bundle, env={**env, "SKYPILOT_NUM_NODES": "3"}, capture_output=True, text=True
    )
    assert wrong.returncode == 2 and "laid out for 2 node(s), SkyPilot started 3" in wrong.stderr
