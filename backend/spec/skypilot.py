"""The job spec's SkyPilot section (launch.skypilot): the resources of sky.yaml, the SkyPilot task every bundle carries
(backend/render/sky.py), and of the managed job tunedeck submits with launch.backend=skypilot.

Every value reaches SkyPilot as a YAML string of sky.yaml, never as shell text; the patterns below are SkyPilot's own
shapes, so a typo is named here rather than by SkyPilot minutes later.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator

from tunedeck.backend.spec.sections import BASIC, SpecSection

# SkyPilot's infra: cloud[/region[/zone]] ("aws", "aws/us-east-1", "k8s", "k8s/my-context", "slurm/mycluster", "*/...").
# Never a leading '-' (a CLI would read an option), no spaces.
SKY_INFRA = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9_.*:@-]*(?:/[A-Za-z0-9_.*:@-]+){0,2}$")
# One accelerator: a GPU or TPU name, with an optional count per node (H100, H100:8, A100-80GB:4, tpu-v5e-8).
SKY_ACCELERATOR = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})(?::(?P<count>[1-9][0-9]{0,3}))?$")
# A managed job's name: SkyPilot's cluster names (letters first, then letters, digits, - _ .).
SKY_NAME = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9])?$")
DEFAULT_ACCELERATOR = "H100"


class SkyPilotSpec(SpecSection):
    """Where SkyPilot runs the job (launch.backend=skypilot, or `sky jobs launch sky.yaml` by hand)."""

    infra: str | None = Field(
        default=None,
        title="SkyPilot infra",
        json_schema_extra=BASIC,
        description="Where SkyPilot provisions the nodes, as `sky check` names them: k8s (or k8s/CONTEXT), aws, "
        "gcp/us-central1, slurm/CLUSTER; empty: the cheapest of the infra `sky check` enabled.",
    )
    accelerators: Annotated[list[str], Field(max_length=8)] = Field(
        default_factory=lambda: [DEFAULT_ACCELERATOR],
        title="GPU types",
        json_schema_extra=BASIC,
        description="The GPU type of each node, e.g. H100, A100-80GB or L4; several (H100, A100-80GB): SkyPilot "
        "takes the first it can get. Each node gets the job's processes per machine in GPUs (a count after ':' "
        "must equal it). Not used with launch.use_cpu.",
    )
    use_spot: bool = Field(
        default=False,
        title="Spot instances",
        description="Ask for spot (preemptible) instances; a preempted job is started again by SkyPilot and "
        "resumes from its newest checkpoint in output_dir when that is on storage the new nodes see.",
    )
    disk_size: int = Field(
        default=0,
        ge=0,
        le=65536,
        title="Disk per node (GB)",
        description="Disk of each node in GB, for the model, the checkpoints and the pip cache; 0: SkyPilot's default.",
    )
    name: str | None = Field(
        default=None,
        title="Managed job name",
        description="Name of the SkyPilot task and managed job (sky jobs queue shows it); empty: tunedeck-METHOD-KIND "
        "in sky.yaml, tunedeck-RUN_ID for a run tunedeck submits.",
    )

    @field_validator("infra")
    @classmethod
    def _infra(cls, value: str | None) -> str | None:
        if value is not None and not SKY_INFRA.match(value):
            raise ValueError(
                f"{value!r} is not a SkyPilot infra: give cloud[/region[/zone]] as `sky check` lists them, e.g. k8s, "
                "aws/us-east-1, slurm/mycluster (letters, digits, _ . * : @ -, at most two '/')"
            )
        return value

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators_from_text(cls, value: Any) -> Any:
        # The form's one-line box holds the types joined by ", ".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: list[str]) -> list[str]:
        for number, item in enumerate(value, start=1):
            if not SKY_ACCELERATOR.match(item):
                raise ValueError(
                    f"item {number} ({item[:40]!r}) is not a GPU type: give a name as `sky show-gpus` lists it "
                    "(H100, A100-80GB, L4), optionally with the GPUs per node after ':' (H100:8)"
                )
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not SKY_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a SkyPilot job name: start with a letter, then letters, digits, - _ . "
                "(at most 64), ending with a letter or digit"
            )
        return value


def accelerator_counts(accelerators: list[str]) -> list[tuple[str, int | None]]:
    """(GPU name, count per node or None) of each entry of launch.skypilot.accelerators."""
    found = [SKY_ACCELERATOR.match(item) for item in accelerators]
    return [(m["name"], int(m["count"]) if m["count"] else None) for m in found if m]
