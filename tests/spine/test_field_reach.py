"""Every spec field does something: it reaches a generated file, train_sft.py reads it from job.yaml, or
the submission reads it (launch.slurm.ssh: where the bundle goes, not what it holds).

A field is changed, one at a time, to other values that still validate, in jobs where it
applies (backend/spec/applies.py); the bundle is rendered again, and some file other than job.yaml
and the README must change. A field that changes no file must be read by train_sft.py: train.py
looks its section up and names the field, or hands the whole section to a library
(`LoraConfig(**job.get("lora"))`). A field that does neither is a knob wired to nothing.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from pydantic import Field

from tunedeck.backend import runs
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS
from tunedeck.backend.render import render_bundle
from tunedeck.backend.render.recipe_files import recipe_files
from tunedeck.backend.spec import JobSpec, SpecError, TrainingSpec, iter_fields, resolve_spec, set_dotted
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import FormField, build_fields
from tunedeck.backend.validate import has_errors, validate

NOT_A_USE = {"job.yaml", "README.md"}  # the spec itself, and the words about it

# Jobs between them where every applicability rule holds at least once.
BASES = [
    ("7b-lora-ddp", []),
    ("7b-full-zero2", []),
    ("7b-full-zero2", ["strategy.kind=zero1"]),
    ("70b-qlora-zero3", []),
    ("70b-qlora-zero3", ["strategy.offload_optimizer=nvme", "strategy.offload_params=nvme", "strategy.nvme_path=/n"]),
    ("13b-lora-fsdp", []),
    ("13b-lora-fsdp", ["strategy.fsdp_version=1"]),
    ("7b-lora-ddp", ["dataset.eval_split=test"]),
    ("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8", "launch.main_process_ip=10.0.0.1"]),
    ("demo", []),
    ("7b-lora-ddp", ["dataset.packing=false"]),
    ("7b-lora-ddp", ["launch.backend=slurm", "launch.num_machines=2", "launch.num_processes=8"]),
    (
        "7b-lora-ddp",
        ["launch.backend=slurm", "launch.slurm.container.image=docker://nvcr.io/nvidia/pytorch:24.05-py3"],
    ),  # both runtimes read it
    ("7b-lora-ddp", ["launch.backend=skypilot"]),
    *[("7b-lora-ddp", [f"dataset.format={name}"]) for name in DATASET_FORMATS],
    ("7b-lora-ddp", ["objective=dpo", "dataset.format=preference"]),
    ("7b-lora-ddp", ["objective=grpo", "dataset.format=prompt-only", "training.per_device_train_batch_size=8"]),
    ("demo-kto", []),
    ("demo-simpo", []),
]


def read_by_train_script(path: str, source: str) -> bool:
    """train.py looks the field up by name in its section, or passes the whole section to a library."""
    strings, passed_whole, looked_up = _what_the_source_reads(source)
    section, _, name = path.rpartition(".")
    if not section:
        return name in strings
    section = section.rpartition(".")[2]  # training.health: its own key, looked up in the training section
    return section in passed_whole or (section in looked_up and name in strings)


@functools.cache
def _what_the_source_reads(source: str) -> tuple[set[str], set[str], set[str]]:
    """(its string constants, the sections it passes whole, the sections it looks up): parsed once a source."""
    tree = ast.parse(source)
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return strings, _sections_passed_whole(tree), _sections_looked_up(tree)


def read_by_submission(path: str) -> bool:
    """backend/runs/ reads the field as an attribute of its section (`ssh.host`): how the run is submitted."""
    section, _, name = path.rpartition(".")
    return (section.rpartition(".")[2], name) in _attributes_the_submission_reads()


@functools.cache
def _attributes_the_submission_reads() -> set[tuple[str | None, str]]:
    """Every (owner, attribute) that backend/runs/ reads, as `owner.attribute`: its modules parsed once."""
    found = set()
    for source in (Path(runs.__file__).parent).glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Attribute):
                owner = node.value
                found.add((getattr(owner, "id", None) or getattr(owner, "attr", None), node.attr))
    return found


def _get_calls(tree: ast.AST):
    """The string keys of every `x.get("key")` call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.args[0].value


def _sections_looked_up(tree: ast.AST) -> set[str]:
    return set(_get_calls(tree))


def _sections_passed_whole(tree: ast.AST) -> set[str]:
    """Sections X of `**job.get("X")`, directly or through a variable assigned from it."""
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    sections = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg is None:  # **something in a call
            for expression in [node.value, *assigned.get(getattr(node.value, "id", None), [])]:
                sections.update(_get_calls(expression))
    return sections


def other_values(field: FormField, value):
    """Values to try instead of `value`: every other choice, the other bool, nearby numbers, other text."""
    if field.kind == "choice":
        return [c for c in field.choices if c != value]
    if field.kind == "bool":
        return [not value]
    if field.kind in ("int", "float"):
        base = value if isinstance(value, (int, float)) else 1
        return [base + 1, base * 2, 1, 10] if field.kind == "int" else [base / 2, base * 2 or 0.5, 0.5]
    if field.path.endswith("gpu_ids"):
        return ["0,1,2,3,4,5,6,7"]
    formats = {
        "grpo.reward_weights": ["1, 0.5", "2"],  # one weight a reward
        "launch.env": ["NCCL_DEBUG=INFO"],
        "launch.skypilot.accelerators": ["A100-80GB"],  # a GPU type SkyPilot knows
    }
    if field.path in formats:
        return formats[field.path]
    slurm_formats = {
        "time_limit": ["90", "1-12:00:00"],
        "mem": ["64G", "0"],
        "extra_directives": ["#SBATCH --x=1"],
        "mounts": ["/data:/data:ro"],
    }
    if field.path.startswith("launch.slurm.") and field.path.rsplit(".", 1)[1] in slurm_formats:
        return slurm_formats[field.path.rsplit(".", 1)[1]]  # Slurm's own formats: free text does not validate
    return [f"{value or 'x'}-changed", *([12_345_678] if field.accepts_int else [])]


def unreached_fields(model: type[JobSpec] = JobSpec, only: set[str] | None = None) -> dict[str, str]:
    """{field: why} for each field of `model` (or of `only`) that no tried change shows in a generated
    file, and that train.py does not read either."""
    source = "\n".join(recipe_files().values())
    bases = [model.model_validate(resolve_spec(preset, overrides).model_dump()) for preset, overrides in BASES]
    rendered = [_used_files(base) for base in bases]
    out = {}
    for field in build_fields(model):
        if only is not None and field.path not in only:
            continue
        if read_by_train_script(field.path, source) or read_by_submission(field.path):
            continue  # read where it runs: whether it also changes a file does not matter
        tried = _reaches(model, field, bases, rendered)
        if tried is not True:
            out[field.path] = "changes no generated file" if tried else "no tried value validates where it applies"
    return out


def _reaches(model: type[JobSpec], field: FormField, bases: list[JobSpec], rendered: list[dict]) -> bool | int:
    """True when a change of the field shows in a generated file, else how many changes were tried."""
    tried = 0
    for base, before in zip(bases, rendered):
        values = _flat(base)
        if not applies(field.path, values):
            continue
        for value in other_values(field, values[field.path]):
            variant = _variant(model, base, field.path, value)
            if variant is None:
                continue
            tried += 1
            if _used_files(variant) != before:
                return True
    return tried


def _flat(spec: JobSpec) -> dict:
    return {path: _get(spec, path) for path, _ in iter_fields(type(spec))}


def _get(spec, path):
    for part in path.split("."):
        spec = getattr(spec, part)
    return spec


def _variant(model: type[JobSpec], base: JobSpec, path: str, value) -> JobSpec | None:
    """The base with one field changed, when that is a valid job (an error stops a real job anyway)."""
    data = base.model_dump(mode="json")
    set_dotted(data, path, value)
    try:
        spec = model.model_validate(data)
    except (SpecError, ValueError):
        return None
    return None if has_errors(validate(spec)) else spec


def _used_files(spec: JobSpec) -> dict[str, str]:
    return {name: text for name, text in render_bundle(spec).items() if name not in NOT_A_USE}


def test_every_field_reaches_a_generated_file_or_the_training_script():
    assert unreached_fields() == {}


def test_a_field_wired_to_nothing_is_found():
    # The check itself: a training knob that no generator and no line of train.py reads.
    class Training(TrainingSpec):
        warmup_ratio_unused: float = Field(0.1, ge=0, le=1, description="A knob nobody reads.")

    class Job(JobSpec):
        training: Training = Field(default_factory=Training)

    assert unreached_fields(Job, only={"training.warmup_ratio_unused", "training.seed"}) == {
        "training.warmup_ratio_unused": "changes no generated file"
    }


@pytest.mark.parametrize(
    "path, reads",
    [
        ("lora.lora_alpha", True),  # the lora section goes whole to peft.LoraConfig
        ("quantization.bnb_4bit_quant_type", True),  # and quantization to BitsAndBytesConfig
        ("model.revision", True),  # looked up in the model section
        ("dataset.prompt_field", True),
        ("training.warmup_ratio_unused", False),
        ("strategy.allgather_bucket_size", False),  # ds_config.json's, not train.py's
        ("training.health.lr_scale", True),  # the health guard's own section
    ],
)
def test_what_the_training_script_reads(path, reads):
    assert read_by_train_script(path, "\n".join(recipe_files().values())) is reads


@pytest.mark.parametrize(
    "path, reads",
    [("launch.slurm.ssh.host", True), ("launch.slurm.ssh.runs_dir", True), ("launch.slurm.ssh.colour", False)],
)
def test_what_the_submission_reads(path, reads):
    assert read_by_submission(path) is reads
