"""The job spec's Slurm section (launch.slurm): the #SBATCH lines of slurm.sbatch, in Slurm's own formats, and the
environment each node trains in (setup lines, a container: rendered by backend/render/slurm_env.py)."""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from tunedeck.backend.spec.sections import BASIC, SpecSection
from tunedeck.backend.spec.slurm_ssh import SlurmSshSpec

# Slurm's own time formats (sbatch --time): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SLURM_TIME = re.compile(r"^(?:\d{1,5}(?::\d{1,2}){0,2}|\d{1,4}-\d{1,2}(?::\d{1,2}){0,2})$")
SLURM_MEMORY = re.compile(r"^\d{1,9}[KMGT]?$")
SLURM_NAME = re.compile(r"^[A-Za-z0-9_.,+-]{1,128}$")  # partitions, accounts, QOS: plain names (a list for partitions)
SBATCH_PREFIX = "#SBATCH "
# An image as pyxis (nvcr.io#nvidia/pytorch:24.05-py3, /path/x.sqsh) or Apptainer (docker://..., /path/x.sif) names
# it; a bind mount as SRC:DST[:ro|rw] with absolute paths. Never a leading '-' (srun or apptainer would read an option).
CONTAINER_IMAGE = re.compile(r"^[A-Za-z0-9_./:#@+=~%][A-Za-z0-9_./:#@+=~%-]{0,511}$")
_PATH = r"/[A-Za-z0-9_./@+=~%-]*"
CONTAINER_MOUNT = re.compile(rf"^(?P<src>{_PATH}):(?P<dst>{_PATH})(?::(?P<mode>ro|rw))?$")
SETUP_SEPARATORS = (";", ", ")  # the form's one-line box: lines joined by "; " (or ", ", as the box shows a list)


class SlurmContainerSpec(SpecSection):
    """The container each node trains in (pyxis's srun --container-image, or apptainer exec)."""

    image: str | None = Field(
        default=None,
        title="Container image",
        description="Image every node runs the job in, e.g. nvcr.io#nvidia/pytorch:24.05-py3 (pyxis), "
        "docker://nvcr.io/nvidia/pytorch:24.05-py3 or /shared/torch.sif (Apptainer); empty: no container.",
    )
    runtime: Literal["pyxis", "apptainer"] = Field(
        default="pyxis",
        title="Container runtime",
        description="pyxis: srun --container-image (Slurm's enroot plugin); apptainer: srun apptainer exec IMAGE.",
    )
    mounts: Annotated[list[str], Field(max_length=32)] = Field(
        default_factory=list,
        title="Container mounts",
        description="Host folders the container sees, SRC:DST[:ro|rw] with absolute paths, joined by ', '; the run "
        "folder is mounted at its own path already.",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not CONTAINER_IMAGE.match(value):
            raise ValueError(
                f"{value!r} is not a container image: a registry image (nvcr.io#nvidia/pytorch:24.05-py3, "
                "docker://...) or a file path, of letters, digits and . / : # @ + = ~ % _ -, never starting with '-'"
            )
        return value

    @field_validator("mounts", mode="before")
    @classmethod
    def _mounts_from_text(cls, value: Any) -> Any:
        # The form's one-line box holds the mounts joined by ", " (a mount never holds a comma: pyxis splits on them).
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        for number, mount in enumerate(value, start=1):
            if not CONTAINER_MOUNT.match(mount):
                raise ValueError(
                    f"item {number} ({mount[:60]!r}) is not a mount: give SRC:DST or SRC:DST:ro, both absolute paths "
                    "of letters, digits and . / _ - @ + = ~ %, e.g. /shared/data:/data:ro"
                )
        return value


class SlurmSpec(SpecSection):
    """How the job is submitted to Slurm (launch.backend=slurm): the #SBATCH lines of slurm.sbatch."""

    partition: str | None = Field(
        default=None,
        title="Slurm partition",
        json_schema_extra=BASIC,
        description="Partition (queue) to submit to; empty: the cluster's default.",
    )
    account: str | None = Field(
        default=None,
        title="Slurm account",
        json_schema_extra=BASIC,
        description="Account charged for the job, where the cluster asks for one.",
    )
    qos: str | None = Field(
        default=None, title="Slurm QOS", description="Quality of service, where the cluster uses them."
    )
    time_limit: str | None = Field(
        default=None,
        title="Time limit",
        json_schema_extra=BASIC,
        description="Wall-clock limit in Slurm's format: minutes (90), HH:MM:SS or D-HH:MM:SS; empty: the partition's.",
    )
    signal_before_s: int = Field(
        default=300,
        ge=10,
        le=65535,
        title="Checkpoint before the limit (s)",
        description="Seconds before the time limit when the ranks are asked to save a checkpoint and stop.",
    )
    # 0 rather than empty for "not set": the form's number box has no empty value.
    gpus_per_node: int = Field(
        default=0,
        ge=0,
        le=1024,
        title="GPUs per node",
        json_schema_extra=BASIC,
        description="GPUs per node to ask for; 0: the processes per machine (GPU runs).",
    )
    cpus_per_task: int = Field(
        default=0,
        ge=0,
        le=4096,
        title="CPUs per node",
        description="CPU cores per node for the node's ranks and data loading; 0: Slurm's default.",
    )
    mem: str | None = Field(
        default=None,
        title="Memory per node",
        description="Memory per node, e.g. 64G or 500M; 0 asks for all of each node's memory; empty: Slurm's default.",
    )
    exclusive: bool = Field(
        default=True, title="Whole nodes", description="Take whole nodes (no other job shares them)."
    )
    requeue: bool = Field(
        default=False,
        title="Requeue on preemption",
        json_schema_extra=BASIC,
        description="When Slurm preempts or requeues the job, it starts again and resumes from its newest checkpoint.",
    )
    extra_directives: Annotated[list[str], Field(max_length=100)] = Field(
        default_factory=list,
        title="Extra #SBATCH lines",
        description="More lines for the script's header, each starting with '#SBATCH ', e.g. #SBATCH --constraint=a100.",
    )

    setup: Annotated[list[str], Field(max_length=50)] = Field(
        default_factory=list,
        title="Node setup lines",
        json_schema_extra=BASIC,
        description="Shell lines each node runs before the launcher, in the job's own shell (setup.sh), e.g. "
        "module load cuda/12.4; source ~/venv/bin/activate. In the box, lines are separated by ';' (or ', ').",
    )
    container: SlurmContainerSpec = Field(
        default_factory=SlurmContainerSpec,
        title="Container",
        description="The container image each node trains in, when the training stack is in one.",
    )
    preflight: bool = Field(
        default=True,
        title="Check the nodes first",
        description="Before submitting, run a short srun on one node that imports the training stack (after the "
        "setup lines, in the container) and compares its versions with requirements.txt; a run it fails is not "
        "submitted.",
    )

    ssh: SlurmSshSpec = Field(
        default_factory=SlurmSshSpec,
        title="Slurm over SSH",
        description="The login node to reach Slurm through, when sbatch is not on this machine.",
    )

    @field_validator("time_limit", "mem", mode="before")
    @classmethod
    def _number_as_text(cls, value: Any) -> Any:
        # YAML reads `mem: 0` and `time_limit: 90` as numbers; Slurm takes them as the same text.
        return str(value) if type(value) is int and 0 <= value < 10**9 else value

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_TIME.match(value):
            raise ValueError(f"{value!r} is not a Slurm time: give minutes (90), HH:MM:SS (1:30:00) or D-HH:MM:SS")
        return value

    @field_validator("mem")
    @classmethod
    def _slurm_memory(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_MEMORY.match(value):
            raise ValueError(f"{value!r} is not a Slurm memory size: give a number with K, M, G or T (64G), or 0")
        return value

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.match(value):
            raise ValueError(f"{value!r} is not a Slurm name: letters, digits and _ . , + - only")
        return value

    @field_validator("extra_directives", mode="before")
    @classmethod
    def _directives_from_text(cls, value: Any) -> Any:
        # The form's one-line box holds the lines joined by ", "; a new line starts at each "#SBATCH ".
        if isinstance(value, str):
            parts = re.split(r"(?=#SBATCH )", value)
            return [part.strip().rstrip(",").strip() for part in parts if part.strip().rstrip(",").strip()]
        return value

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, value: list[str]) -> list[str]:
        for number, line in enumerate(value, start=1):
            if not line.startswith(SBATCH_PREFIX) or not line[len(SBATCH_PREFIX) :].strip():
                raise ValueError(
                    f"item {number} ({line[:40]!r}) is not an #SBATCH line: start each with '#SBATCH ' and an option"
                )
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return split_setup_text(value)
        return value

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: list[str]) -> list[str]:
        for number, line in enumerate(value, start=1):
            problem = setup_line_problem(line)
            if problem:
                raise ValueError(f"item {number} ({line[:40]!r}) {problem}")
        return [line.strip() for line in value if line.strip()]

    def time_limit_s(self) -> int | None:
        """The time limit in seconds (None: none given)."""
        if self.time_limit is None:
            return None
        days, _, clock = self.time_limit.rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        if days:  # D-HH[:MM[:SS]]
            parts += [0] * (3 - len(parts))
            return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
        if len(parts) == 1:  # minutes
            return parts[0] * 60
        if len(parts) == 2:  # MM:SS
            return parts[0] * 60 + parts[1]
        return parts[0] * 3600 + parts[1] * 60 + parts[2]


def split_setup_text(text: str) -> list[str]:
    """The form's box as lines: split at each ';' and ', ' outside quotes (a line joined by ';' runs the same)."""
    lines, current, quote, index = [], "", "", 0
    while index < len(text):
        char = text[index]
        if char == "\\" and quote != "'" and index + 1 < len(text):
            current, index = current + text[index : index + 2], index + 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif text.startswith(SETUP_SEPARATORS, index):
            lines.append(current)
            current, index = "", index + (1 if char == ";" else 2)
            continue
        current, index = current + char, index + 1
    return [line.strip() for line in [*lines, current] if line.strip()]


def setup_line_problem(line: str) -> str | None:
    """Why a setup line would reach past its own line of setup.sh, or None: each line must be a whole command."""
    if re.search(r"(?:^|[^\\])(?:\\\\)*\\$", line):
        return "ends with '\\', which would join it to the next line: put the whole command on one line"
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return "has an unclosed quote: close it on the same line (each line is a whole command)"
    if re.search(r"(?<!<)<<(?!<)", line):
        return "starts a here-document, which would read the lines after it: write the text to a file instead"
    return None
