"""training_args.yaml: the keyword arguments of TRL's SFTConfig (DPOConfig, KTOConfig, GRPOConfig by objective), complete.

The training entrypoint passes them as `SFTConfig(**kwargs)` unchanged, so this file
is exactly what runs. The two configs share the Trainer's arguments; a field only one of
them takes applies only with its objective (backend/spec/applies.py). A spec field that is an SFTConfig argument says so itself (SftField
in backend/spec/sections.py) and is copied here by name where it applies (backend/spec/applies.py);
only the keys derived from several fields, or from where the job runs, are written by hand.

It carries the CPU specifics too (measured, docs/notes/cpu-distributed.md): DDP on CPU needs
`use_cpu: true` in the script (the accelerate YAML's use_cpu does not reach the processes),
DeepSpeed on CPU needs `use_cpu: false`; both need gloo; and SFTConfig defaults bf16=True, so
precision is always written out.
"""

from __future__ import annotations

import yaml

from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.spec import FIELD_PATHS, JobSpec, flat_values, sft_name
from tunedeck.backend.spec.applies import applies

# TRL's SFTTrainer tokenises on the global main process first, then on each node's local main, while
# every other rank waits in a barrier (trl/trainer/utils.py, global_then_local_main_first). That
# barrier, like every collective, gives up after ddp_timeout (default 1800 s): a multi-million-row
# dataset outlasts it. Three hours still ends a real hang the same day (LLaMA-Factory's examples use
# 180000000 s, which never does).
DDP_TIMEOUT_S = 10_800
# Processes that tokenise while the other ranks wait (alignment-handbook's recipes use 12-24).
DATASET_NUM_PROC = 8


# Spec field -> SFTConfig argument, for every field declared as one (SftField in the spec).
SFT_ARGUMENTS = {path: sft_name(path) for path in FIELD_PATHS if sft_name(path)}


def copied_arguments(spec: JobSpec) -> dict:
    """The SFTConfig arguments the spec holds as they are: copied by name where the field applies."""
    values = flat_values(spec)
    return {name: values[path] for path, name in SFT_ARGUMENTS.items() if applies(path, values)}


def training_args_dict(spec: JobSpec) -> dict:
    """The copied arguments, then the ones derived from several fields or from where the job runs."""
    t, d, s, launch = spec.training, spec.dataset, spec.strategy, spec.launch
    args = copied_arguments(spec)
    args.update(OBJECTIVES[spec.objective].fixed)  # what the objective sets itself (SimPO: CPO's simpo loss)
    args["bf16"] = t.precision == "bf16"
    args["fp16"] = t.precision == "fp16"
    if t.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA), DDP and FSDP. Adapters on
        # ZeRO-3 are the exception: TRL's SFTTrainer forces reentrant there for correct gradients
        # (trl#2514), so the file says so rather than promise what does not run.
        reentrant = spec.uses_adapter and spec.layout.is_zero3
        args["activation_checkpointing_kwargs"] = {"use_reentrant": reentrant}
    if not launch.use_cpu and spec.objective != "grpo":  # GRPO tokenises its prompts as it goes
        # GPU jobs only: CPU bundles (the demo, the tests) have small data, and their cores are the trainers.
        args["dataset_num_proc"] = DATASET_NUM_PROC
    if not launch.use_cpu and launch.num_processes > 1:
        args["ddp_timeout"] = DDP_TIMEOUT_S
    if t.group_by_length and applies("training.group_by_length", flat_values(spec)):
        # transformers 5 replaced the group_by_length flag with this sampler choice.
        args["train_sampling_strategy"] = "group_by_length"
    if spec.sequence_parallel > 1:
        args["pad_to_multiple_of"] = sequence_padding(spec)
    args["logging_first_step"] = True  # a first point on the loss chart right away
    # The Trainer logs a NaN or Inf step's loss as the window's mean by default: the health guard
    # (training.health) and the chart must see it as it is.
    args["logging_nan_inf_filter"] = False
    args["save_strategy"] = "steps"
    if d.eval_split:
        args["eval_strategy"] = "steps"
        args["eval_steps"] = t.eval_steps or t.logging_steps
        if d.general_text and applies("dataset.general_text", flat_values(spec)):
            # the general-text loss before the first step: what the model knew, which later evaluations compare with
            args["eval_on_start"] = True
    else:
        args["eval_strategy"] = "no"
    if launch.use_cpu:
        # DeepSpeed drives the CPU itself (its CPU accelerator), so it must not see use_cpu.
        args["use_cpu"] = not s.is_deepspeed
        if launch.num_processes > 1 or s.is_deepspeed:
            # Ranks talk over gloo. A lone process started without a launcher has no rank
            # environment, and SFTConfig fails to build a gloo group there: leave it out then.
            args["ddp_backend"] = "gloo"
    return args


def sequence_padding(spec: JobSpec) -> int:
    """Ulysses cuts each batch into equal slices, one per GPU of the sequence, so its length must divide.

    On CPU every batch is padded to max_length as well: gloo's all_gather, which Ulysses uses to share
    the batches of a sequence's GPUs, takes equal sizes only (NCCL takes uneven ones).
    """
    n = spec.sequence_parallel
    if spec.launch.use_cpu:
        return -(-spec.dataset.max_seq_length // n) * n
    return n


def render_training_args(spec: JobSpec) -> str:
    return yaml.safe_dump(training_args_dict(spec), sort_keys=False)
