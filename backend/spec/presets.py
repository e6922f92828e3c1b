"""Presets and the package's own data: partial specs merged over the defaults, the demo's folder.

A preset is a YAML file in presets/ (shipped as package data): an id, a title, a description
and a partial spec, which may say {demo} for the folder where the demo model and data are built.
"""

from __future__ import annotations

import copy
import os
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tunedeck.backend.spec.job import JobSpec
from tunedeck.backend.spec.parse import (
    SpecError,
    load_spec_file,
    parse_assignments,
    parse_spec,
    set_paths,
    spec_to_dict,
)
from tunedeck.backend.spec.problem import error

# The package's own folder: the repository root in a checkout, site-packages/tunedeck when installed.
# Presets, assets and constraints.txt ship in it as package data.
PACKAGE_DIR = Path(str(files("tunedeck")))
PRESETS_DIR = PACKAGE_DIR / "presets"
# The general-text sample: the forgetting check's after training (backend/after/general_text.py), and the file a
# bundle carries for a job whose dataset.general_text is built-in (backend/recipe/general_text.py).
GENERAL_TEXT_SAMPLE = PACKAGE_DIR / "assets" / "eval" / "general-text.txt"


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class PresetHardware(BaseModel):
    """The machine a preset is meant for: the advisor recommends the preset's strategy there (tests pin it)."""

    model_config = ConfigDict(extra="forbid")
    gpus: int = Field(ge=0, description="GPUs in all (launch.num_processes); 0 for a CPU job")
    gpu: str | None = Field(default=None, description="a GPU the advisor knows (gpu_fit.GPU_MEMORY_GB), e.g. A100-80GB")
    gpu_mem_gb: float | None = Field(default=None, gt=0, description="memory of one such GPU in GB")
    ram_gb: float = Field(gt=0, description="host RAM per machine in GB")

    @property
    def label(self) -> str:
        """'4x RTX 4090 (24 GB), 128 GB RAM' or 'CPU only, 4 GB RAM'."""
        if not self.gpus:
            return f"CPU only, {self.ram_gb:g} GB RAM"
        return f"{self.gpus}x {self.gpu} ({self.gpu_mem_gb:g} GB), {self.ram_gb:g} GB RAM"


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    title: str
    description: str
    hardware: PresetHardware | None = Field(default=None, description="what the preset is meant for")
    spec: dict = Field(default_factory=dict, description="Partial spec merged over the defaults.")

    def build(self) -> JobSpec:
        merged = deep_merge(spec_to_dict(JobSpec()), _expand_placeholders(self.spec))
        return parse_spec(merged)


def _expand_placeholders(data: Any) -> Any:
    """Presets may say {demo} for the folder where the demo model and data are built."""
    if isinstance(data, dict):
        return {k: _expand_placeholders(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_expand_placeholders(v) for v in data]
    if isinstance(data, str) and "{demo}" in data:
        return data.replace("{demo}", str(demo_home()))
    return data


def demo_home() -> Path:
    """Folder of the built demo model and dataset ($TUNEDECK_HOME/demo, default ~/.cache/tunedeck/demo)."""
    home = os.environ.get("TUNEDECK_HOME") or Path.home() / ".cache" / "tunedeck"
    return Path(home) / "demo"


def load_presets(directory: Path = PRESETS_DIR) -> dict[str, Preset]:
    presets = {}
    for file in sorted(directory.glob("*.yaml")):
        preset = Preset.model_validate(yaml.safe_load(file.read_text(encoding="utf-8")))
        if preset.id != file.stem:
            raise ValueError(f"{file}: preset id {preset.id!r} must match the file name")
        presets[preset.id] = preset
    return presets


def resolve_spec(source: str, overrides: list[str] | None = None) -> JobSpec:
    """A preset id or a YAML path, with `--set dotted.path=value` overrides applied."""
    presets = load_presets()
    if source in presets:
        spec = presets[source].build()
    elif Path(source).is_file():
        spec = load_spec_file(source)
    else:
        raise SpecError([error("", f"{source!r} is neither a preset ({', '.join(presets)}) nor an existing YAML file")])
    if overrides:
        spec = set_paths(spec, parse_assignments(overrides))
    return spec
