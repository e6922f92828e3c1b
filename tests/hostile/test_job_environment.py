"""Issue 36 part 2: the nodes' environment (launch.slurm.setup, launch.slurm.container) reaches the nodes as
the spec holds it, and no value of it becomes a command of the scripts around it.

The bundle's own slurm.sbatch runs under bash, with stand-ins for what cannot run here: `srun` and
`apptainer` record their argv as JSON and then run the command they were given, as the real ones do;
`accelerate` records its environment (tests/hostile/helpers.py). The setup lines are shell lines by
design: they run, each on its own line of setup.sh, and nothing of them reaches srun's command.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.runs.preflight_nodes import check_argv, stack_problems
from tunedeck.backend.spec import SpecError, parse_spec, resolve_spec, spec_to_dict

from .helpers import cli, error_fields, install_stand_ins, recorded_argv, run_bundle_scripts
from .test_shell_payloads import DANGEROUS, REFUSED

SETUP, IMAGE, MOUNTS = "launch.slurm.setup", "launch.slurm.container.image", "launch.slurm.container.mounts"

# srun: record argv (per node), then run the command after srun's options, once per node, like srun -N2.
SRUN = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
command = args[next(i for i, a in enumerate(args) if not a.startswith("--")):]
status = 0
for node in "01":
    with open(os.path.join(os.environ["ARGV_DIR"], "srun-" + node + ".json"), "w") as out:
        json.dump(args, out)
    status = subprocess.run(command, env={{**os.environ, "SLURM_NODEID": node}}).returncode or status
sys.exit(status)
"""
# apptainer exec [--nv] [--bind M]... [--pwd DIR] IMAGE COMMAND...: record argv, run COMMAND.
APPTAINER = f"""#!{sys.executable}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.path.join(os.environ["ARGV_DIR"], "apptainer-" + os.environ["SLURM_NODEID"] + ".json"), "w") as out:
    json.dump(args, out)
i = 1
while args[i].startswith("--"):
    i += 1 if args[i] == "--nv" else 2
sys.exit(subprocess.run(args[i + 1 :]).returncode)
"""


def _spec(**slurm):
    data = spec_to_dict(resolve_spec("demo"))
    data["launch"].update(backend="slurm", num_machines=2, num_processes=2)
    data["launch"]["slurm"].update(slurm)
    return parse_spec(data)


def _run_sbatch(tmp_path: Path, spec) -> tuple[Path, Path, dict]:
    """Write the bundle, run its slurm.sbatch with the stand-ins; (bundle, argv folder, results)."""
    bundle, argv_dir = tmp_path / "bundle", tmp_path / "argv"
    write_bundle(render_bundle(spec), bundle)
    bin_dir = install_stand_ins(tmp_path)
    for name, text in {"srun": SRUN, "apptainer": APPTAINER}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    results = run_bundle_scripts(bundle, bin_dir, argv_dir)
    return bundle, argv_dir, results


def _json(path: Path) -> list[str]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("kind", list(DANGEROUS))
def test_setup_lines_run_on_each_node_before_launch_and_their_values_stay_data(tmp_path, kind):
    marker = tmp_path / "PWNED"
    payload = DANGEROUS[kind].format(marker=marker)
    lines = [
        f"'; touch {marker}; '",  # would close srun's `bash -c '...'` if the line were written into it
        f"export PAYLOAD_PROBE={shlex.quote(payload)}",  # the line's last word: the value, quoted by its author
    ]
    spec = _spec(setup=lines)
    bundle, argv_dir, results = _run_sbatch(tmp_path, spec)
    assert results["slurm.sbatch"].returncode == 0, results["slurm.sbatch"].stderr
    assert not marker.exists(), f"a {kind} payload ran"
    assert (bundle / "setup.sh").read_text().splitlines()[-2:] == lines  # each line its own line, unchanged
    srun_line = next(line for line in (bundle / "slurm.sbatch").read_text().splitlines() if line.startswith("srun "))
    assert payload not in srun_line and marker.name not in srun_line  # srun's command holds no setup text
    for node in ("0", "1"):  # setup.sh ran in the node's shell, then launch.sh with the node's rank
        assert (argv_dir / f"env-{node}").read_text() == payload
        argv = recorded_argv(argv_dir, node)
        assert argv[argv.index("--machine_rank") + 1] == node
        assert _json(argv_dir / f"srun-{node}.json")[-3:-1] == ["bash", "-c"]
    assert "setup.sh" in (bundle / "README.md").read_text() and lines[1] in (bundle / "README.md").read_text()


def test_a_failing_setup_stops_the_node_before_launch(tmp_path):
    spec = _spec(setup=["false"])
    _, argv_dir, results = _run_sbatch(tmp_path, spec)
    assert results["slurm.sbatch"].returncode == 97
    assert "setup.sh (launch.slurm.setup) failed" in results["slurm.sbatch"].stderr
    assert not (argv_dir / "accelerate-0").exists()


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_container_image_and_mounts_reach_srun_and_apptainer_as_single_words(tmp_path, runtime):
    # Legal, and each changes if a shell reads it unquoted: ~ expands, # starts a comment after a space.
    image = "~/img=1%x.sif" if runtime == "apptainer" else "nvcr.io#nvidia/pytorch:24.05-py3"
    mounts = ["/data/~x=1:/data:ro", "/a%b@c:/scratch"]
    spec = _spec(
        setup=["export PAYLOAD_PROBE=in-container"], container={"image": image, "runtime": runtime, "mounts": mounts}
    )
    bundle, argv_dir, results = _run_sbatch(tmp_path, spec)
    assert results["slurm.sbatch"].returncode == 0, results["slurm.sbatch"].stderr
    here = str(bundle)
    for node in ("0", "1"):
        srun = _json(argv_dir / f"srun-{node}.json")
        script = srun[-1]
        if runtime == "pyxis":
            assert srun[:4] == [
                "--kill-on-bad-exit=1",
                f"--container-image={image}",
                f"--container-mounts={here}:{here},{','.join(mounts)}",
                f"--container-workdir={here}",
            ]
        else:
            assert srun[0] == "--kill-on-bad-exit=1" and srun[1] == "apptainer"
            apptainer = _json(argv_dir / f"apptainer-{node}.json")
            assert apptainer == [
                "exec",
                "--bind",
                mounts[0],
                "--bind",
                mounts[1],
                "--pwd",
                here,
                image,
                "bash",
                "-c",
                script,
            ]
        assert script.startswith("source ./setup.sh ||") and image not in script
        assert (argv_dir / f"env-{node}").read_text() == "in-container"  # the setup ran in the container's shell
    readme = (bundle / "README.md").read_text()
    assert image in readme and all(mount in readme for mount in mounts)


def test_the_node_check_passes_every_value_as_one_argument(tmp_path):
    image, mounts = "nvcr.io#nvidia/pytorch:24.05-py3", ["/data/~x=1:/data:ro"]
    spec = _spec(partition="gpu-a,gpu-b", setup=["module load cuda"], container={"image": image, "mounts": mounts})
    argv = check_argv(spec, "/runs/a b")
    assert "--partition=gpu-a,gpu-b" in argv and f"--container-image={image}" in argv
    assert "--container-mounts=/runs/a b:/runs/a b,/data/~x=1:/data:ro" in argv and "--chdir=/runs/a b" in argv
    script = argv[argv.index("-c") + 1]
    assert "module" not in script and image not in script  # the check's script holds no value of the spec


def test_the_node_report_names_what_is_missing_and_what_is_older():
    spec = _spec(setup=["source /opt/venv/bin/activate"])
    report = {
        "node": "n0",
        "python": "/opt/venv/bin/python3",
        "packages": {"torch": "1.0.0+cu118", "accelerate": "99.0"},
        "missing": {"trl": "ModuleNotFoundError: No module named 'trl'"},
        "accelerate_command": "/opt/venv/bin/accelerate",
    }
    problems = stack_problems(spec, report)
    assert {p.field for p in problems} == {SETUP}
    errors = [p.message for p in problems if p.level == "error"]
    assert any(m.startswith("missing trl on node n0 (/opt/venv/bin/python3)") for m in errors), errors
    assert any("torch is 1.0.0+cu118" in m and "the bundle pins" in m for m in errors), errors
    assert [p.level for p in problems if "accelerate is 99.0" in p.message] == ["warning"]  # newer: told, not refused


@pytest.mark.parametrize("field", [IMAGE, MOUNTS])
def test_container_values_refuse_every_shell_payload(tmp_path, field):
    marker = tmp_path / "PWNED"
    for kind, template in {**DANGEROUS, "option": "--container-mounts=/:/host", "dash": "-x"}.items():
        value = template.format(marker=marker)
        job = tmp_path / "one.yaml"
        nested = {"image": value} if field == IMAGE else {"mounts": [value]}
        job.write_text(yaml.safe_dump({"launch": {"backend": "slurm", "slurm": {"container": nested}}}))
        code, _, err = cli("export", str(job), "-o", str(tmp_path / "out"))
        assert code == 2 and error_fields(err) == [field], (kind, err)
        assert "never starting with '-'" in err if field == IMAGE else "SRC:DST" in err
    assert not (tmp_path / "out").exists() and not marker.exists()


@pytest.mark.parametrize(
    "line, said",
    [
        ("module load cuda \\", "ends with '\\'"),
        ("echo 'unclosed", "unclosed quote"),
        ("cat <<EOF", "here-document"),
    ],
)
def test_a_setup_line_that_would_reach_past_its_line_is_refused(tmp_path, line, said):
    job = tmp_path / "one.yaml"
    job.write_text(yaml.safe_dump({"launch": {"backend": "slurm", "slurm": {"setup": ["module load x", line]}}}))
    code, _, err = cli("export", str(job), "-o", str(tmp_path / "out"))
    assert code == 2 and error_fields(err) == [SETUP] and said in err and "item 2" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", list(REFUSED))
def test_control_characters_are_refused_in_the_new_fields(tmp_path, kind):
    payload = REFUSED[kind].format(marker=tmp_path / "PWNED")
    for field, value in ((SETUP, [payload]), (IMAGE, payload), (MOUNTS, [payload])):
        *_, leaf = field.split(".")
        slurm = {leaf: value} if field == SETUP else {"container": {leaf: value}}
        job = tmp_path / "one.yaml"
        job.write_text(yaml.safe_dump({"launch": {"backend": "slurm", "slurm": slurm}}))
        code, _, err = cli("export", str(job), "-o", str(tmp_path / "out"))
        assert code == 2 and field in error_fields(err), (field, err)


def test_the_form_box_splits_setup_lines_outside_quotes():
    spec = _spec(setup="module load cuda/12.4; source ~/venv/bin/activate, export X='a; b, c'")
    assert spec.launch.slurm.setup == ["module load cuda/12.4", "source ~/venv/bin/activate", "export X='a; b, c'"]
    again = _spec(setup=", ".join(spec.launch.slurm.setup))  # the form shows a list joined by ", "
    assert again.launch.slurm.setup == spec.launch.slurm.setup
    with pytest.raises(SpecError):
        _spec(setup=["x"] * 51)
