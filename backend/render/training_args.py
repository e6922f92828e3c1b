"""training_args.yaml: the keyword arguments of TRL's SFTConfig, complete.

The training entrypoint passes them as `SFTConfig(**kwargs)` unchanged, so this file
is exactly what runs. It carries the CPU specifics too (measured, docs/notes/cpu-distributed.md):
DDP on CPU needs `use_cpu: true` in the script (the accelerate YAML's use_cpu does not
reach the processes), DeepSpeed on CPU needs `use_cpu: false`; both need gloo; and
SFTConfig defaults bf16=True, so precision is always written out.
"""

from __future__ import annotations

import yaml

from tunedeck.backend.spec import JobSpec

# TRL's SFTTrainer tokenises on the global main process first, then on each node's local main, while
# every other rank waits in a barrier (trl/trainer/utils.py, global_then_local_main_first). That
# barrier, like every collective, gives up after ddp_timeout (default 1800 s): a multi-million-row
# dataset outlasts it. Three hours still ends a real hang the same day (LLaMA-Factory's examples use
# 180000000 s, which never does).
DDP_TIMEOUT_S = 10_800
# Processes that tokenise while the other ranks wait (alignment-handbook's recipes use 12-24).
DATASET_NUM_PROC = 8


def training_args_dict(spec: JobSpec) -> dict:
    t, d, s, launch = spec.training, spec.dataset, spec.strategy, spec.launch
    args: dict = {
        "output_dir": spec.output_dir,
        "seed": t.seed,
        "num_train_epochs": t.num_train_epochs,
        "max_steps": t.max_steps,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "per_device_eval_batch_size": t.per_device_eval_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "lr_scheduler_type": t.lr_scheduler_type,
        "warmup_steps": t.warmup_steps,
        "optim": t.optim,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "bf16": t.precision == "bf16",
        "fp16": t.precision == "fp16",
        # The name since transformers 5.23 (gradient_checkpointing is its deprecated alias): see requirements.py.
        "activation_checkpointing": t.gradient_checkpointing,
    }
    if t.gradient_checkpointing:
        # Non-reentrant checkpointing works with frozen inputs (LoRA), DDP and FSDP. Adapters on
        # ZeRO-3 are the exception: TRL's SFTTrainer forces reentrant there for correct gradients
        # (trl#2514), so the file says so rather than promise what does not run.
        reentrant = spec.uses_adapter and s.zero_stage == 3
        args["activation_checkpointing_kwargs"] = {"use_reentrant": reentrant}
    if not launch.use_cpu:
        # GPU jobs only: CPU bundles (the demo, the tests) have small data, and their cores are the trainers.
        args["dataset_num_proc"] = DATASET_NUM_PROC
        if launch.num_processes > 1:
            args["ddp_timeout"] = DDP_TIMEOUT_S
    args["max_length"] = d.max_seq_length
    args["packing"] = d.packing
    if d.format == "text":
        args["dataset_text_field"] = d.text_field
    args["logging_steps"] = t.logging_steps
    args["logging_first_step"] = True  # a first point on the loss chart right away
    args["save_strategy"] = "steps"
    args["save_steps"] = t.save_steps
    args["save_total_limit"] = t.save_total_limit
    if d.eval_split:
        args["eval_strategy"] = "steps"
        args["eval_steps"] = t.eval_steps or t.logging_steps
    else:
        args["eval_strategy"] = "no"
    args["report_to"] = t.report_to
    if s.kind == "ddp":
        args["ddp_find_unused_parameters"] = t.ddp_find_unused_parameters
    if launch.use_cpu:
        # DeepSpeed drives the CPU itself (its CPU accelerator), so it must not see use_cpu.
        args["use_cpu"] = not s.is_deepspeed
        if launch.num_processes > 1 or s.is_deepspeed:
            # Ranks talk over gloo. A lone process started without a launcher has no rank
            # environment, and SFTConfig fails to build a gloo group there: leave it out then.
            args["ddp_backend"] = "gloo"
    return args


def render_training_args(spec: JobSpec) -> str:
    return yaml.safe_dump(training_args_dict(spec), sort_keys=False)
