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


def _job_file(tmp_path, payload: str):
    """A job.yaml (the form a shared or uploaded job takes) with every text field set to payload."""
    data = spec_to_dict(resolve_spec("demo"))
    for path in TEXT_FIELDS:
        section, _, leaf = path.rpartition(".")
        target = data[section] if section else data
        target[leaf] = [payload] if path == "lora.target_modules" else payload
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
        value = [payload] if field == "lora.target_modules" else payload
        job = tmp_path / "one.yaml"
        job.write_text(yaml.safe_dump(_nest(field, value)), encoding="utf-8")  # escaped: "\\x85", "\\L"
        code, _, err = cli("export", str(job), "-o", str(out))
        assert code == 2, (field, err)
        assert field in error_fields(err), (field, err)
        assert "one line of visible characters" in err
        assert not out.exists()
    # All fields at once: every one is named.
    code, _, err = cli("export", str(_job_file(tmp_path, payload)), "-o", str(tmp_path / "all"))
    assert code == 2 and set(TEXT_FIELDS) <= set(error_fields(err)), err
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
    readme = (bundle / "README.md").read_text()
    assert payload in readme.splitlines()[0]  # the title names the model, inside a code span


def _nest(path: str, value) -> dict:
    section, _, leaf = path.rpartition(".")
    return {section: {leaf: value}} if section else {leaf: value}
