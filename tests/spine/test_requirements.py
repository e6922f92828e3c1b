"""Bundles pin what they were generated for: requirements.txt, the README's minimums, and `tunedeck check`."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tunedeck.backend.cli import main
from tunedeck.backend.render import render_bundle
from tunedeck.backend.render.requirements import CONSTRAINTS_FILE, minimums, parse_pins
from tunedeck.backend.render.requirements import tested_versions as pinned_versions
from tunedeck.backend.spec import resolve_spec

from .conftest import PRESET_IDS, STRATEGY_KINDS


def requirements(files: dict[str, str]) -> dict[str, Requirement]:
    lines = [line for line in files["requirements.txt"].splitlines() if line and not line.startswith("#")]
    parsed = [Requirement(line) for line in lines]  # pip's own requirement grammar
    return {r.name.lower(): r for r in parsed}


@pytest.mark.parametrize("preset", PRESET_IDS)
def test_every_bundle_pins_the_tested_stack_it_imports(preset):
    spec = resolve_spec(preset)
    reqs = requirements(render_bundle(spec))
    pins = parse_pins(CONSTRAINTS_FILE.read_text())
    for name in (
        "torch",
        "transformers",
        "trl",
        "peft",
        "accelerate",
        "datasets",
        "tokenizers",
        "pyyaml",
        "nvidia-ml-py",
    ):
        assert str(reqs[name].specifier) == f"=={pins[name]}", name
    assert ("deepspeed" in reqs) == spec.strategy.is_deepspeed
    assert ("bitsandbytes" in reqs) == (spec.quantization.bits is not None)
    assert "gradio" not in reqs and "pytest" not in reqs  # the panel and the tests are not the training stack


@pytest.mark.parametrize("kind", STRATEGY_KINDS)
def test_the_tested_versions_meet_every_minimum(kind):
    spec = resolve_spec("7b-full-zero2", [f"strategy.kind={kind}"])
    tested = pinned_versions()
    for need in minimums(spec):
        assert Version(tested[need.package]) >= Version(need.version), need


def test_overlap_comm_needs_the_deepspeed_that_fixed_its_nan_race():
    needs = {m.package: m.version for m in minimums(resolve_spec("7b-full-zero2"))}
    assert needs == {"transformers": "5.23.0", "deepspeed": "0.19.0"}
    no_overlap = {m.package for m in minimums(resolve_spec("7b-full-zero2", ["strategy.overlap_comm=false"]))}
    assert no_overlap == {"transformers"}
    zero3 = {m.package for m in minimums(resolve_spec("70b-qlora-zero3"))}
    assert zero3 == {"transformers"}  # the race was in the ZeRO-1/2 reduction path (deepspeed#7965)


def test_readme_names_requirements_the_minimums_and_libaio_for_nvme():
    readme = render_bundle(resolve_spec("7b-full-zero2"))["README.md"]
    assert "pip install -r requirements.txt" in readme
    assert "`requirements.txt`: the training stack at the versions tunedeck was tested with" in readme
    assert "transformers >= 5.23.0" in readme and "deepspeed >= 0.19.0" in readme and "NaN" in readme
    assert "libaio" not in readme
    nvme = resolve_spec(
        "70b-qlora-zero3",
        ["strategy.offload_optimizer=nvme", "strategy.offload_params=nvme", "strategy.nvme_path=/nvme"],
    )
    assert "apt-get install libaio-dev" in render_bundle(nvme)["README.md"]


def test_without_constraints_the_file_states_minimums(tmp_path):
    assert pinned_versions(tmp_path / "absent.txt") == {}
    from tunedeck.backend.render.requirements import render_requirements

    reqs = render_requirements(resolve_spec("7b-full-zero2"), {})
    assert "transformers>=5.23.0" in reqs and "deepspeed>=0.19.0" in reqs and "\ntrl\n" in reqs


# ---------------------------------------------------------------- the installed stack


def fake_distribution(site: Path, name: str, version: str) -> None:
    """What pip leaves behind for an installed distribution: its .dist-info metadata."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_check_passes_quietly_on_the_installed_stack(export, check):
    assert check(export(resolve_spec("7b-full-zero2"))).warnings == []


def test_check_warns_when_the_installed_stack_is_older_than_the_bundle_needs(tmp_path, monkeypatch, capsys, export):
    folder = export(resolve_spec("7b-full-zero2"))
    site = tmp_path / "old-site"
    fake_distribution(site, "deepspeed", "0.18.9")  # found first on sys.path, as an older install would be
    monkeypatch.syspath_prepend(str(site))
    assert main(["check", str(folder)]) == 0  # the files themselves are fine
    err = capsys.readouterr().err
    assert "warning: installed stack: deepspeed 0.18.9 is older than 0.19.0" in err
    assert "NaN" in err and "pip install -r requirements.txt" in err
    assert "transformers" not in err  # 5.24 is new enough


def test_a_refused_file_names_the_too_old_library(tmp_path, monkeypatch, capsys, export):
    folder = export(resolve_spec("7b-lora-ddp"))
    training_args = folder / "training_args.yaml"
    training_args.write_text(training_args.read_text() + "no_such_argument: 1\n")  # as transformers 5.22 reads ours
    site = tmp_path / "old-site"
    fake_distribution(site, "transformers", "5.22.0")
    monkeypatch.syspath_prepend(str(site))
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "trl.SFTConfig refused it" in err
    assert "the installed stack is older than this bundle needs: transformers 5.22.0 is older than 5.23.0" in err
