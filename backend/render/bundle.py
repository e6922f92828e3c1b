"""The bundle: every file of a job as one pure function of its JobSpec, and the bundle written to a zip or a folder.

render_bundle(spec) -> {file name: text}, in display order; zip_bundle(files) -> zip bytes.
Each file comes from one small module here (accelerate_yaml, deepspeed_json,
training_args, launch, slurm, sky, requirements). Only spec and catalog are imported: no torch, no accelerate.
A bundle that carries the job's local data (backend/render/bundle_data.py) has them in data/ besides its files:
zip_bundle and write_bundle copy them from this machine (carried.py: what a bundle carries).
"""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from functools import lru_cache
from pathlib import Path

from tunedeck.backend.recipe.general_text import BUILTIN as GENERAL_TEXT_BUILTIN
from tunedeck.backend.recipe.general_text import FILE as GENERAL_TEXT_FILE
from tunedeck.backend.render.accelerate_yaml import DEEPSPEED_CONFIG_FILE, render_accelerate_config
from tunedeck.backend.render.bundle_readme import render_bundle_readme
from tunedeck.backend.render.carried import DATA_NAME, DataPlan
from tunedeck.backend.render.deepspeed_json import render_deepspeed_json
from tunedeck.backend.render.launch import (
    ACCELERATE_CONFIG,
    JOB_FILE,
    TRAIN_SCRIPT,
    TRAINING_ARGS_FILE,
    render_launch_sh,
)
from tunedeck.backend.render.recipe_files import ENTRY_SCRIPT, RECIPE_PACKAGE, recipe_files
from tunedeck.backend.render.requirements import REQUIREMENTS_FILE, render_requirements, tested_versions
from tunedeck.backend.render.sky import SKY_FILE, render_sky_yaml
from tunedeck.backend.render.slurm import SLURM_FILE, render_slurm_sbatch
from tunedeck.backend.render.slurm_env import SETUP_FILE, has_environment, render_setup_sh
from tunedeck.backend.render.training_args import render_training_args
from tunedeck.backend.spec import GENERAL_TEXT_SAMPLE, JobSpec, spec_to_yaml

EXECUTABLE_FILES = frozenset({"launch.sh"})


@lru_cache(maxsize=1)
def general_text_sample() -> str:
    """The built-in general-text sample, read once: the panel renders a bundle on every change."""
    return GENERAL_TEXT_SAMPLE.read_text(encoding="utf-8")


def render_bundle(spec: JobSpec, data: DataPlan | None = None) -> dict[str, str]:
    """Every file of the job's bundle. Callers validate first: an invalid spec exports nothing.

    `data`: what the bundle carries of the job's local files and what it leaves (README.md lists them); the spec
    is then the one the bundle runs, naming the carried files in data/ (backend/render/bundle_data.py)."""
    files = {
        JOB_FILE: spec_to_yaml(spec),
        ACCELERATE_CONFIG: render_accelerate_config(spec),
    }
    if spec.strategy.is_deepspeed:
        files[DEEPSPEED_CONFIG_FILE] = render_deepspeed_json(spec)
    files[TRAINING_ARGS_FILE] = render_training_args(spec)
    files["launch.sh"] = render_launch_sh(spec)
    files[SLURM_FILE] = render_slurm_sbatch(spec)
    if has_environment(spec):  # launch.slurm.setup / container: sourced on each node before launch.sh
        files[SETUP_FILE] = render_setup_sh(spec)
    files[SKY_FILE] = render_sky_yaml(spec)  # the same bundle as a SkyPilot task (Kubernetes, clouds)
    if spec.dataset.general_text == GENERAL_TEXT_BUILTIN:  # the sample the general-text check scores
        files[GENERAL_TEXT_FILE] = general_text_sample()
    package = recipe_files()  # the recipe, under tunedeck_recipe/, which train_sft.py runs
    if package:
        files[TRAIN_SCRIPT] = ENTRY_SCRIPT
    files[REQUIREMENTS_FILE] = render_requirements(spec, tested_versions())
    names = [*files, "README.md"]  # what README.md lists: the recipe's folder right after its entry script
    if package:
        names.insert(names.index(TRAIN_SCRIPT) + 1, f"{RECIPE_PACKAGE}/")
    files["README.md"] = render_bundle_readme(spec, names, data)
    return {**files, **package}


def zip_bundle(files: dict[str, str], data: dict[str, Path] | None = None) -> bytes:
    """The bundle as a zip with the files at its top level, after the data files it carries (bundle path -> file
    here); byte-identical for identical files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        zip_data(archive, data or {})
        zip_files(archive, files)
    return buffer.getvalue()


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))  # a fixed date: the same files, the same bytes
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100000 | mode) << 16  # regular file + permissions, for unzip
    return info


def zip_files(archive: zipfile.ZipFile, files: dict[str, str]) -> None:
    for name, text in files.items():
        archive.writestr(_zip_info(name, 0o755 if name in EXECUTABLE_FILES else 0o644), text.encode("utf-8"))


def zip_data(archive: zipfile.ZipFile, data: dict[str, Path]) -> None:
    """The carried data files, read from this machine's disk a block at a time, under their names in data/."""
    for name, source in data.items():
        info = _zip_info(_data_name(name), 0o644)
        with open(source, "rb") as file, archive.open(info, "w") as entry:
            shutil.copyfileobj(file, entry, 1 << 20)


def _data_name(name: str) -> str:
    """A carried file's bundle path, if it is one (data/ and plain names below it); ValueError for anything else."""
    if not DATA_NAME.match(name):
        raise ValueError(f"refusing to write a data file named {name!r} into a bundle")
    return name


def write_bundle(files: dict[str, str], directory: Path, data: dict[str, Path] | None = None) -> list[Path]:
    """Write the files into a folder (created if needed), and copy the data files it carries into its data/
    (copies, never links: the bundle must hold them when it moves); launch.sh becomes executable."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)  # tunedeck_recipe/
        path.write_text(text, encoding="utf-8")
        if name in EXECUTABLE_FILES:
            path.chmod(0o755)
        written.append(path)
    for name, source in (data or {}).items():
        path = directory / _data_name(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.part")
        shutil.copyfile(source, partial)
        os.replace(partial, path)  # replaces a link of that name instead of writing through it
        written.append(path)
    return written
