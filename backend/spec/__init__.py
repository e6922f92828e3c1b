"""The job spec's public face: one import for everything a caller needs of the spec.

A JobSpec is one typed, validated description of a fine-tuning job; presets, forms, uploaded
YAML and the CLI all produce one, and every generated file is a pure function of one. A spec
round-trips: spec -> YAML -> spec is the identity. The code lives by concern:

  vocabulary.py     the strategy kinds and the dataset formats (one table each)
  spec_sections.py  what is trained: model, LoRA, quantization, dataset
  spec_training.py  the training section: epochs, learning rate, batches, checkpoints
  spec_job.py       how it runs: strategy and launch; the JobSpec as a whole
  spec_slurm.py     launch.slurm: the #SBATCH lines, in Slurm's formats
  spec_parse.py     YAML and dicts in and out, `--set`, the field registry, SpecError
  presets.py        presets and the package's data folder, the demo's folder
"""

from tunedeck.backend.spec.job import JobSpec, LaunchSpec, OffloadDevice, StrategyKind, StrategySpec
from tunedeck.backend.spec.parse import (
    FIELD_PATHS,
    MAX_PROBLEMS,
    SpecError,
    field_info,
    flat_values,
    get_path,
    iter_fields,
    load_spec_file,
    parse_assignments,
    parse_spec,
    set_dotted,
    set_paths,
    sft_name,
    spec_from_dict,
    spec_from_yaml,
    spec_to_dict,
    spec_to_yaml,
)
from tunedeck.backend.spec.presets import (
    PACKAGE_DIR,
    PRESETS_DIR,
    Preset,
    deep_merge,
    demo_home,
    load_presets,
    resolve_spec,
)
from tunedeck.backend.spec.sections import (
    MAX_ELEMENTS,
    MAX_STEPS,
    MAX_TEXT,
    DatasetSpec,
    Dtype,
    LoraSpec,
    ModelSpec,
    QuantizationSpec,
)
from tunedeck.backend.spec.training import PreferenceSpec, TrainingSpec

__all__ = [
    "FIELD_PATHS",
    "MAX_ELEMENTS",
    "MAX_PROBLEMS",
    "MAX_STEPS",
    "MAX_TEXT",
    "PACKAGE_DIR",
    "PRESETS_DIR",
    "DatasetSpec",
    "Dtype",
    "JobSpec",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "OffloadDevice",
    "PreferenceSpec",
    "Preset",
    "QuantizationSpec",
    "SpecError",
    "StrategyKind",
    "StrategySpec",
    "TrainingSpec",
    "deep_merge",
    "demo_home",
    "field_info",
    "flat_values",
    "get_path",
    "iter_fields",
    "load_presets",
    "load_spec_file",
    "parse_assignments",
    "parse_spec",
    "resolve_spec",
    "set_dotted",
    "set_paths",
    "sft_name",
    "spec_from_dict",
    "spec_from_yaml",
    "spec_to_dict",
    "spec_to_yaml",
]  # fmt: skip
