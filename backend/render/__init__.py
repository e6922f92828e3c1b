"""Pure generators: a JobSpec in, the files the Hugging Face stack reads out.

render_bundle(spec) -> {file name: text}, in display order; zip_bundle(files) -> zip bytes.
Each file comes from one small module here (accelerate_yaml, deepspeed_json,
training_args, launch, slurm, requirements). Only spec and catalog are imported: no torch, no accelerate.
"""

from __future__ import annotations

import io
import zipfile
from functools import lru_cache
from pathlib import Path

from tunedeck.backend.render.accelerate_yaml import DEEPSPEED_CONFIG_FILE, render_accelerate_config
from tunedeck.backend.render.bundle_readme import render_bundle_readme
from tunedeck.backend.render.deepspeed_json import render_deepspeed_json
from tunedeck.backend.render.launch import (
    ACCELERATE_CONFIG,
    JOB_FILE,
    TRAIN_SCRIPT,
    TRAINING_ARGS_FILE,
    render_launch_sh,
)
from tunedeck.backend.render.requirements import REQUIREMENTS_FILE, render_requirements, tested_versions
from tunedeck.backend.render.slurm import SLURM_FILE, render_slurm_sbatch
from tunedeck.backend.render.training_args import render_training_args
from tunedeck.backend.spec import JobSpec, spec_to_yaml

# The training entrypoint ships in every bundle under TRAIN_SCRIPT's name.
TRAIN_ENTRYPOINT = Path(__file__).resolve().parent.parent / "train.py"


@lru_cache(maxsize=1)
def train_script() -> str | None:
    """train.py's text, read once: the panel renders a bundle on every change."""
    try:
        return TRAIN_ENTRYPOINT.read_text(encoding="utf-8")
    except OSError:
        return None


EXECUTABLE_FILES = frozenset({"launch.sh"})


def render_bundle(spec: JobSpec) -> dict[str, str]:
    """Every file of the job's bundle. Callers validate first: an invalid spec exports nothing."""
    files = {
        JOB_FILE: spec_to_yaml(spec),
        ACCELERATE_CONFIG: render_accelerate_config(spec),
    }
    if spec.strategy.is_deepspeed:
        files[DEEPSPEED_CONFIG_FILE] = render_deepspeed_json(spec)
    files[TRAINING_ARGS_FILE] = render_training_args(spec)
    files["launch.sh"] = render_launch_sh(spec)
    files[SLURM_FILE] = render_slurm_sbatch(spec)
    script = train_script()
    if script is not None:
        files[TRAIN_SCRIPT] = script
    files[REQUIREMENTS_FILE] = render_requirements(spec, tested_versions())
    files["README.md"] = render_bundle_readme(spec, list(files) + ["README.md"])
    return files


def zip_bundle(files: dict[str, str]) -> bytes:
    """The bundle as a zip with the files at its top level; byte-identical for identical files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if name in EXECUTABLE_FILES else 0o644
            info.external_attr = (0o100000 | mode) << 16  # regular file + permissions, for unzip
            archive.writestr(info, text.encode("utf-8"))
    return buffer.getvalue()


def write_bundle(files: dict[str, str], directory: Path) -> list[Path]:
    """Write the files into a folder (created if needed); launch.sh becomes executable."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        if name in EXECUTABLE_FILES:
            path.chmod(0o755)
        written.append(path)
    return written
