"""Issue 8.1: nothing in a spec executes when someone runs the exported bundle.

Every text field of the spec gets shell payloads. The ones no text field can hold (line
breaks, control characters) are refused with the field named and nothing written. The ones a
name or path may well hold (`$( )`, backticks, quotes, `;`, `#`, spaces) export; then the
bundle's own launch.sh and slurm.sbatch run under bash with stand-in launchers, and no
payload may run, while the value reaches the launcher (and job.yaml) byte for byte.
"""

from __future__ import annotations

from typing import get_args

import pytest
import yaml

from tunedeck.backend.spec import iter_fields, resolve_spec, spec_from_yaml, spec_to_dict

from .helpers import cli, error_fields, install_stand_ins, recorded_argv, run_bundle_scripts


def _takes_text(annotation) -> bool:
    return annotation is str or any(_takes_text(arg) for arg in get_args(annotation))


TEXT_FIELDS = [path for path, info in iter_fields() if _takes_text(info.annotation)]
# Slurm's own formats (names, times, sizes): no shell payload fits them, so each is refused with
# its field named (test_slurm_formats_refuse_every_payload) rather than exported.
FORMATTED = [
    "launch.slurm.partition",
    "launch.slurm.account",
    "launch.slurm.qos",
    "launch.slurm.time_limit",
    "launch.slurm.mem",
    "grpo.rewards",  # a built-in reward's name or /path/FILE.py:FUNCTION
    "launch.slurm.ssh.host",  # a host name or ~/.ssh/config alias: the other ssh fields travel as data
    "launch.slurm.ssh.user",  # (tests/slurm/test_ssh_link.py)
    "launch.slurm.container.image",  # an image name or path; it and the mounts reach srun as single words
    "launch.slurm.container.mounts",  # (tests/hostile/test_job_environment.py)
    "launch.skypilot.infra",  # SkyPilot's own shapes, YAML strings of sky.yaml's resources
    "launch.skypilot.accelerators",  # (tests/hostile/test_skypilot_values.py)
    "launch.skypilot.name",
]
# Shell lines by design (module load, source ...): each node runs them; tests/hostile/test_job_environment.py
# shows that they stay on their own lines of setup.sh and never reach srun's command.
SHELL_LINES = "launch.slurm.setup"
# Each entry must be NAME=VALUE: the payload is the value, which launch.sh exports as one quoted word.
ENVIRONMENT = "launch.env"
# A source of more rows: SOURCE[@CONFIG][:SPLIT][#ROWS].
MIX = "dataset.mix"
# Each line must be an #SBATCH directive: the payload goes after one, where sbatch reads it and bash never runs it.
DIRECTIVES = "launch.slurm.extra_directives"

# Each would end a line of a script (or look like it does in an editor or terminal).
REFUSED = {
    "newline": "x\ntouch {marker} #",
    "carriage return": "x\rtouch {marker}",
    "NUL": "x\0touch {marker}",
    "line separator": "x\u2028touch {marker}",
    "next line (C1)": "x\x85touch {marker}",
    "escape": "x\x1b]0;touch {marker}\x07",
    "tab": "x\ttouch {marker}",
    "delete": "x\x7f",
}
# Legal in a file name or an id, and each one runs `touch` if a script uses it unquoted.
DANGEROUS = {
    "command substitution": "$(touch {marker})",
    "backticks": "`touch {marker}`",
    "single quotes": "'; touch {marker}; '",
    "double quotes": '"; touch {marker}; "',
    "semicolon and comment": "x; touch {marker} #",
    "comment first": "# $(touch {marker})",
    "spaces and variables": "a b ${{IFS}}$(touch {marker}) $HOME",
}


def test_every_text_field_is_covered():
    assert {"model.name_or_path", "lora.target_modules", "dataset.path", "launch.main_process_ip", "output_dir"} <= set(
        TEXT_FIELDS
    )
    assert len(TEXT_FIELDS) >= 19
    assert set(FORMATTED) | {DIRECTIVES, ENVIRONMENT, MIX, SHELL_LINES} <= set(TEXT_FIELDS)


def _value(path: str, payload: str):
    if path == DIRECTIVES:
        return [f"#SBATCH --comment={payload}"]
    if path == ENVIRONMENT:
        return [f"PAYLOAD_PROBE={payload}"]
    if path == MIX:  # '#', '@' and ':' are the entry's syntax (#ROWS, @CONFIG, :SPLIT); the rest is a file name
        return [payload.replace("#", "").replace("@", "").replace(":", "")]
    return [payload] if path in ("lora.target_modules", "grpo.rewards") else payload


def _job_file(tmp_path, payload: str, refused: bool = False):
    """A job.yaml (the form a shared or uploaded job takes) with every text field set to payload."""
    data = spec_to_dict(resolve_spec("demo"))
    for path in TEXT_FIELDS:
        if (path in FORMATTED or path == SHELL_LINES) and not refused:
            continue
        *sections, leaf = path.split(".")
        target = data
        for section in sections:
            target = target[section]
        target[leaf] = _value(path, payload)
    data["launch"].update(num_machines=2, num_processes=2)  # so main_process_ip reaches the launcher
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data), encoding="utf-8")
    return job


@pytest.mark.parametrize("kind", list(REFUSED))
def test_control_characters_are_refused_in_every_text_field(tmp_path, kind):
    marker = tmp_path / "PWNED"
    payload = REFUSED[kind].format(marker=marker)
    for field in TEXT_FIELDS:
        out = tmp_path / f"out-{field}"
        value = _value(field, payload)
        job = tmp_path / "one.yaml"
        job.write_text(yaml.safe_dump(_nest(field, value)), encoding="utf-8")  # escaped: "\\x85", "\\L"
        code, _, err = cli("export", str(job), "-o", str(out))
        assert code == 2, (field, err)
        assert field in error_fields(err), (field, err)
        assert "one line of visible characters" in err
        assert not out.exists()
    code, _, err = cli("export", str(_job_file(tmp_path, payload, refused=True)), "-o", str(tmp_path / "all"))
    # All fields at once: each is named, up to the CLI's 20 problems and a count of the rest.
    named = set(error_fields(err)) - {"spec"}
    assert code == 2 and named <= set(TEXT_FIELDS) and len(named) >= min(len(TEXT_FIELDS), 20), err
    assert not (tmp_path / "all").exists() and not marker.exists()


def test_a_raw_line_break_in_set_is_refused_not_folded(tmp_path):
    # YAML would fold "x\ntouch ..." into "x touch ...": the value must be refused, not changed.
    code, _, err = cli(
        "export", "demo", "--set", f"model.name_or_path=x\ntouch {tmp_path}/PWNED #", "-o", str(tmp_path / "o")
    )
    assert code == 2 and error_fields(err) == ["model.name_or_path"] and "U+000A (line feed)" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", list(DANGEROUS))
def test_payloads_export_and_the_scripts_run_none_of_them(tmp_path, kind):
    marker = tmp_path / "PWNED"
    payload = DANGEROUS[kind].format(marker=marker)
    bundle = tmp_path / "bundle"
    code, _, err = cli("export", str(_job_file(tmp_path, payload)), "-o", str(bundle))
    assert code == 0, err
    spec = spec_from_yaml((bundle / "job.yaml").read_text())
    assert spec.model.name_or_path == payload and spec.output_dir == payload  # carried intact

    argv_dir = tmp_path / "argv"
    results = run_bundle_scripts(bundle, install_stand_ins(tmp_path), argv_dir)
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr)
    assert not marker.exists(), f"a {kind} payload ran"

    # launch.sh hands the spec's main node address to accelerate as one argument, unchanged.
    local = recorded_argv(argv_dir, "local")
    assert local[local.index("--main_process_ip") + 1] == payload
    assert local[:3] == ["launch", "--config_file", "accelerate_config.yaml"]
    # Under Slurm each node runs launch.sh with its node id, and the allocation's first host wins.
    for node in ("0", "1"):
        argv = recorded_argv(argv_dir, node)
        assert argv[argv.index("--machine_rank") + 1] == node
        assert argv[argv.index("--main_process_ip") + 1] == "node-a"
        assert (argv_dir / f"cwd-{node}").read_text().strip() == str(bundle)
    for where in ("local", "0", "1"):  # launch.env's value reaches every rank's launcher as it was typed
        assert (argv_dir / f"env-{where}").read_text() == payload
    readme = (bundle / "README.md").read_text()
    assert payload in readme.splitlines()[0]  # the title names the model, inside a code span


def _nest(path: str, value) -> dict:
    nested = value
    for part in reversed(path.split(".")):
        nested = {part: nested}
    return nested


@pytest.mark.parametrize("field", FORMATTED)
def test_slurm_formats_refuse_every_payload(tmp_path, field):
    marker = tmp_path / "PWNED"
    for kind, template in DANGEROUS.items():
        job = tmp_path / "one.yaml"
        job.write_text(yaml.safe_dump(_nest(field, template.format(marker=marker))), encoding="utf-8")
        code, _, err = cli("export", str(job), "-o", str(tmp_path / "out"))
        assert code == 2 and error_fields(err) == [field], (kind, err)
    assert not (tmp_path / "out").exists() and not marker.exists()


def test_extra_directives_must_be_sbatch_lines(tmp_path):
    for line in ("--time=5", "echo hi", "#SBATCH", "#SBATCH    ", "# SBATCH --x=1"):
        code, _, err = cli(
            "export", "demo", "--set", f"launch.slurm.extra_directives=[{line!r}]", "-o", str(tmp_path / "o")
        )
        assert code == 2 and error_fields(err) == [DIRECTIVES] and "#SBATCH" in err, (line, err)
    code, _, err = cli(
        "export",
        "demo",
        "--set",
        "launch.slurm.extra_directives=['#SBATCH --constraint=a100']",
        "-o",
        str(tmp_path / "o"),
    )
    assert code == 0, err
    assert "#SBATCH --constraint=a100\n" in (tmp_path / "o" / "slurm.sbatch").read_text()
