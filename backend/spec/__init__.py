"""The job spec's face: what the panel, the CLI and the layers above import of the spec, by name
(`from tunedeck.backend.spec import JobSpec`), never from its modules.

A JobSpec is one typed, validated description of a fine-tuning job; presets, forms, uploaded
YAML and the CLI all produce one, and every generated file is a pure function of one. A spec
round-trips: spec -> YAML -> spec is the identity. The code lives by concern (the strategy and
dataset-format tables sit in the recipe, backend/recipe/vocabulary.py, which ships in every bundle):

  sections.py, training.py, grpo.py, mix.py, slurm.py, env.py   the sections of a job
  job.py          how it runs: strategy and launch; the JobSpec as a whole
  parse.py        YAML and dicts in and out, `--set`, the field registry, SpecError
  presets.py      presets and the package's data folder, the demo's folder
  problem.py      a problem of a job: level, field, message with the fix
  applies.py, implied.py, fields.py   when a field applies, what a choice implies, the form's view of a field
  catalog.py, model_arch.py, flops.py, engine_facts.py   what is known of models and GPUs
  untrusted.py    text people hand us, read with limits; docs.py: docs/job-spec.md, generated
"""

from tunedeck.backend.spec.docs import spec_markdown
from tunedeck.backend.spec.fields import (
    FIELDS_BY_PATH,
    FORM_FIELDS,
    FormField,
    Values,
    choice_text,
    section_shown,
    section_titles,
    spec_from_values,
    values_from_form,
    values_from_spec,
    visible,
)
from tunedeck.backend.spec.flops import gpu_row
from tunedeck.backend.spec.implied import describe
from tunedeck.backend.spec.implied import implied as apply_implied
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
    GENERAL_TEXT_SAMPLE,
    PACKAGE_DIR,
    PRESETS_DIR,
    Preset,
    deep_merge,
    demo_home,
    load_presets,
    resolve_spec,
)
from tunedeck.backend.spec.problem import Problem, refuses_start, spelled
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
from tunedeck.backend.spec.untrusted import shown

__all__ = [
    "FIELDS_BY_PATH",
    "FIELD_PATHS",
    "FORM_FIELDS",
    "GENERAL_TEXT_SAMPLE",
    "MAX_ELEMENTS",
    "MAX_PROBLEMS",
    "MAX_STEPS",
    "MAX_TEXT",
    "PACKAGE_DIR",
    "PRESETS_DIR",
    "DatasetSpec",
    "Dtype",
    "FormField",
    "JobSpec",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "OffloadDevice",
    "PreferenceSpec",
    "Preset",
    "Problem",
    "QuantizationSpec",
    "SpecError",
    "StrategyKind",
    "StrategySpec",
    "TrainingSpec",
    "Values",
    "apply_implied",
    "choice_text",
    "deep_merge",
    "demo_home",
    "describe",
    "field_info",
    "flat_values",
    "get_path",
    "gpu_row",
    "iter_fields",
    "load_presets",
    "load_spec_file",
    "parse_assignments",
    "parse_spec",
    "refuses_start",
    "resolve_spec",
    "section_shown",
    "section_titles",
    "set_dotted",
    "set_paths",
    "sft_name",
    "shown",
    "spec_from_dict",
    "spec_from_values",
    "spec_from_yaml",
    "spec_markdown",
    "spec_to_dict",
    "spec_to_yaml",
    "spelled",
    "values_from_form",
    "values_from_spec",
    "visible",
]  # fmt: skip
