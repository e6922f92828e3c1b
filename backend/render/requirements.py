"""requirements.txt of a bundle: the training stack pinned to the versions tunedeck was tested with.

The pins come from the repository's constraints.txt (what dev.sh installs and every test runs
on), read once and passed in, so render_requirements stays a pure function of its arguments.
Beside them, the minimums the generated files need, each with its reason; the bundle README
lists them and `tunedeck check` (bundle_check.py) warns when the installed stack is older.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunedeck.backend.spec import PACKAGE_DIR, JobSpec

REQUIREMENTS_FILE = "requirements.txt"
CONSTRAINTS_FILE = PACKAGE_DIR / "constraints.txt"

# What train_sft.py imports, in install order (torch first: it decides the CUDA build); nvidia-ml-py for the
# telemetry of each machine's GPUs (recipe/telemetry.py; psutil comes with accelerate).
_ALWAYS = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "PyYAML", "nvidia-ml-py")


@dataclass(frozen=True)
class Minimum:
    package: str
    version: str
    reason: str


def minimums(spec: JobSpec) -> list[Minimum]:
    """The oldest versions this job's files work with, and why (each checked against the library's history)."""
    needs = [
        Minimum(
            "transformers",
            "5.23.0",
            "training_args.yaml names activation checkpointing `activation_checkpointing`, an argument "
            "transformers added in 5.23.0 (older versions refuse the key)",
        )
    ]
    layout = spec.layout
    if layout.is_deepspeed and not layout.shards_parameters and spec.strategy.overlap_comm:  # ZeRO-1/2
        needs.append(
            Minimum(
                "deepspeed",
                "0.19.0",
                "ZeRO-1/2 with overlap_comm: DeepSpeed 0.19.0 fixed a race that turns the loss into NaN "
                "(deepspeed#7965, overlap-comm buffer lifetimes)",
            )
        )
    if spec.sequence_parallel > 1:
        needs += [
            Minimum(
                "accelerate",
                "1.12.0",
                "accelerate_config.yaml's parallelism_config sp_size (DeepSpeed Ulysses) arrived in accelerate 1.12.0 "
                "(transformers' deepspeed_alst guide)",
            ),
            Minimum(
                "deepspeed",
                "0.18.2",
                "Ulysses' attention and data loader adapter (UlyssesSPAttentionHF): accelerate refuses older DeepSpeed",
            ),
        ]
    return needs


def packages(spec: JobSpec) -> list[str]:
    """The training stack this job imports."""
    extra = (["deepspeed"] if spec.strategy.is_deepspeed else []) + (["bitsandbytes"] if spec.quantization.bits else [])
    extra += ["liger-kernel"] if spec.training.use_liger_kernel else []
    return [*_ALWAYS, *extra]


def parse_pins(text: str) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines of a constraints file."""
    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+).*", line)
        if match:
            pins[_normalise(match.group(1))] = match.group(2)
    return pins


@lru_cache(maxsize=1)
def tested_versions(path: Path = CONSTRAINTS_FILE) -> dict[str, str]:
    """The pins of constraints.txt; empty when it is absent (then requirements.txt states minimums only)."""
    try:
        return parse_pins(path.read_text(encoding="utf-8"))
    except OSError:
        return {}


def render_requirements(spec: JobSpec, tested: dict[str, str]) -> str:
    floors = {_normalise(m.package): m.version for m in minimums(spec)}
    lines = [
        "# The training stack this bundle was generated for, at the versions tunedeck was tested with.",
        "# Install torch first (the build for your CUDA), then: pip install -r requirements.txt",
    ]
    for package in packages(spec):
        key = _normalise(package)
        if key in tested:
            lines.append(f"{package}=={tested[key]}")
        elif key in floors:
            lines.append(f"{package}>={floors[key]}")
        else:
            lines.append(package)
    return "\n".join(lines) + "\n"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503
