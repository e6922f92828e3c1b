"""The bundle carries the recipe: train_sft.py beside the package tunedeck_recipe/, which runs without tunedeck.

The training itself from a bundle alone is tests/runs/test_bundle_data.py's and tests/test_wheel.py's (integration);
here the bundle's files and the package's imports, in a second each.
"""

from __future__ import annotations

import subprocess
import sys

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.render.recipe_files import ENTRY_SCRIPT, RECIPE_DIR, RECIPE_PACKAGE
from tunedeck.backend.spec import resolve_spec

TRAINING_STACK = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "deepspeed", "yaml")


def test_the_bundle_holds_the_entry_and_every_module_of_the_recipe():
    files = render_bundle(resolve_spec("demo"))
    assert files["train_sft.py"] == ENTRY_SCRIPT
    modules = sorted(RECIPE_DIR.glob("*.py"))
    assert {path.name for path in modules} >= {"__init__.py", "train_sft.py", "vocabulary.py", "records.py"}
    for path in modules:
        assert files[f"{RECIPE_PACKAGE}/{path.name}"] == path.read_text(encoding="utf-8"), path.name
    assert f"- `{RECIPE_PACKAGE}/`: the training recipe train_sft.py runs" in files["README.md"]


def test_the_bundles_recipe_imports_from_its_folder_where_tunedeck_cannot_be_imported(tmp_path):
    bundle, elsewhere, poison = tmp_path / "bundle", tmp_path / "elsewhere", tmp_path / "poison"
    write_bundle(render_bundle(resolve_spec("demo")), bundle)
    elsewhere.mkdir()
    for package in ("tunedeck", "backend", "app"):  # first on the path, and refusing to be imported
        (poison / package).mkdir(parents=True)
        (poison / package / "__init__.py").write_text("raise ImportError('the bundle must not import tunedeck')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(poison)}
    probe = (
        "import sys\n"
        f"import {RECIPE_PACKAGE}.train_sft as entry\n"
        f"heavy = [name for name in {TRAINING_STACK!r} if name in sys.modules]\n"
        "assert not heavy, heavy  # the training stack comes inside the functions that need it\n"
        "print(entry.parse_args([]).job)\n"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe], cwd=bundle, env=env, capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "job.yaml"
    # The entry script finds the recipe beside itself from any folder, as launch.sh and `accelerate launch` start it.
    helped = subprocess.run(
        [sys.executable, str(bundle / "train_sft.py"), "--help"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "--training-args" in helped.stdout
