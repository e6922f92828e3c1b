"""The job spec's training section: epochs, steps, learning rate, batches, optimizer, checkpoints.

Its own module only to keep spec_sections.py (the other sections on what is trained) short;
the field helpers (SftField, BASIC, the bounds) are spec_sections.py's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tunedeck.backend.spec.health import HealthSpec
from tunedeck.backend.spec.sections import BASIC, MAX_STEPS, SftField, SpecSection, Steps


class TrainingSpec(SpecSection):
    num_train_epochs: float = SftField(
        1.0,
        gt=0,
        le=10_000,
        title="Epochs",
        basic=True,
        description="Passes over the training data (ignored when max_steps > 0).",
    )
    max_steps: int = SftField(
        -1,
        ge=-1,
        le=MAX_STEPS,
        title="Max steps",
        basic=True,
        description="Stop after this many optimizer steps; -1 trains for num_train_epochs.",
    )
    learning_rate: float = SftField(
        2e-4,
        gt=0,
        lt=1,
        title="Learning rate",
        basic=True,
        description="Peak learning rate. LoRA: 1e-4 to 3e-4; full fine-tuning: 1e-5 to 2e-5; DPO, KTO: a tenth "
        "of these.",
    )
    lr_scheduler_type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
    ] = SftField("cosine", title="LR schedule", description="Learning-rate schedule after warmup.")
    warmup_steps: float = SftField(
        0.03,
        ge=0,
        le=MAX_STEPS,
        title="Warmup",
        description="Warmup: whole steps, or a fraction of all steps when below 1 (0.03 = 3%).",
    )
    per_device_train_batch_size: int = SftField(
        1,
        ge=1,
        le=4096,
        title="Batch per GPU",
        basic=True,
        description="Micro batch per GPU per forward pass. Keep small; raise gradient accumulation instead.",
    )
    per_device_eval_batch_size: int = SftField(
        1, ge=1, le=4096, title="Eval batch per GPU", description="Micro batch per GPU for evaluation."
    )
    gradient_accumulation_steps: int = SftField(
        8,
        ge=1,
        le=4096,
        title="Gradient accumulation",
        basic=True,
        description="Micro batches summed before each optimizer step.",
    )
    gradient_checkpointing: bool = SftField(
        True,
        sft="activation_checkpointing",  # SFTConfig's name since transformers 5.23: see render/requirements.py
        title="Gradient checkpointing",
        basic=True,
        description="Recompute activations in the backward pass: much less memory, about 30% slower.",
    )
    precision: Literal["bf16", "fp16", "fp32"] = Field(
        default="bf16",
        title="Mixed precision",
        json_schema_extra=BASIC,
        description="Mixed precision of training: bf16 (Ampere or newer), fp16 (older GPUs, loss scaling), fp32 (CPU).",
    )
    optim: Literal[
        "adamw_torch",
        "adamw_torch_fused",
        "adamw_bnb_8bit",
        "paged_adamw_8bit",
        "paged_adamw_32bit",
        "adafactor",
        "sgd",
    ] = SftField(
        "adamw_torch_fused",
        title="Optimizer",
        description="Optimizer (transformers name). adamw_torch_fused (transformers' default on torch 2.8+) updates "
        "all weights in one kernel per step; 8-bit and paged variants need bitsandbytes.",
    )
    weight_decay: float = SftField(0.0, ge=0, le=1, title="Weight decay", description="Decoupled weight decay.")
    max_grad_norm: float = SftField(
        1.0, ge=0, le=1e6, title="Gradient clipping", description="Gradient clipping norm; 0 disables clipping."
    )
    # numpy (seeded by transformers.set_seed) takes 0 to 2**32-1, and says so only after the model loaded.
    seed: int = SftField(
        42, ge=0, le=2**32 - 1, title="Seed", description="Random seed for data order and adapter initialisation."
    )
    logging_steps: Steps = SftField(
        10, title="Log every", description="Log loss and learning rate every this many steps."
    )
    save_steps: Steps = SftField(500, title="Checkpoint every", description="Save a checkpoint every this many steps.")
    save_total_limit: int | None = SftField(
        2,
        ge=1,
        le=100_000,
        title="Checkpoints kept",
        description="Keep at most this many checkpoints; empty keeps all.",
    )
    eval_steps: Steps | None = Field(
        default=None,
        title="Evaluate every",
        description="Evaluate every this many steps (needs an eval split); empty uses logging_steps.",
    )
    report_to: Literal["none", "tensorboard", "wandb", "mlflow", "trackio"] = SftField(
        "none",
        title="Experiment tracker",
        description="Extra experiment tracker; tunedeck's own metrics are always written.",
    )
    ddp_find_unused_parameters: bool = SftField(
        False,
        title="Find unused parameters (DDP)",
        description="Let DDP search for parameters without gradients. False for LoRA (frozen base), faster.",
    )
    group_by_length: bool = Field(
        default=True,
        title="Group by length",
        description="Without packing: batch rows of similar length together (transformers' "
        "train_sampling_strategy=group_by_length), so a batch pads to less.",
    )
    dataloader_num_workers: int = SftField(
        2,
        title="Data loader workers",
        ge=0,
        le=64,
        description="Processes that collate batches beside each GPU rank, so the GPU does not wait for the next batch.",
    )
    use_liger_kernel: bool = SftField(
        False,
        title="Liger kernels",
        description="Liger's Triton kernels for RMSNorm, RoPE and SwiGLU: less memory and faster steps on NVIDIA GPUs; "
        "needs the liger-kernel package and a Llama, Mistral, Mixtral, Gemma, Qwen2/3 or Phi-3 model.",
    )
    torch_compile: bool = SftField(
        False,
        title="torch.compile",
        description="Compile the model with torch.compile: faster steps after a compile of a few minutes at the start.",
    )
    neftune_noise_alpha: float | None = SftField(
        None,
        gt=0,
        le=100,
        title="NEFTune noise",
        description="Noise added to the input embeddings while training (NEFTune, arXiv:2310.05914), scaled by "
        "alpha / sqrt(tokens x hidden size): 5 is the paper's usual value; empty for none. Supervised fine-tuning.",
    )
    resume_from_checkpoint: bool = Field(
        default=False,
        title="Resume from checkpoint",
        description="Continue from the newest checkpoint in the output folder, if there is one.",
    )
    health: HealthSpec = Field(
        default_factory=HealthSpec,
        title="Training health",
        description="What the run does when its loss or gradient norm goes NaN, to zero, or spikes.",
    )


class PreferenceSpec(SpecSection):
    """Preference training's settings: the arguments of the same names of the preference objectives' TRL configs
    (backend/recipe/objectives_table.py says which objective reads each)."""

    beta: float = SftField(
        0.1,
        gt=0,
        le=100,
        title="Beta",
        description="DPO, KTO: how far the trained model may move from the reference (the base; with adapters, the "
        "base with the adapters off): higher keeps it closer; 0.1 is usual. ORPO: the weight of its preference term "
        "(the log odds ratio) beside the chosen answers' loss; 0.1 is usual. SimPO: the scale of its reward (the "
        "answer's mean log-probability); its paper uses 2 to 2.5, higher than the others.",
    )
    loss_type: Literal["sigmoid", "ipo", "hinge", "robust", "apo_zero", "apo_down"] = SftField(
        "sigmoid",
        title="Preference loss",
        description="sigmoid: DPO's loss; ipo: IPO (beta is its regulariser); hinge: SLiC's; robust: DPO robust "
        "to noisy labels; apo_zero / apo_down: APO, when the chosen answers are better / worse than the model's.",
    )
    desirable_weight: float = SftField(
        1.0,
        gt=0,
        le=100,
        title="Good-answer weight",
        description="KTO: the weight of the answers labelled good. With fewer good than bad answers, raise it "
        "until weight x good count is about 1-1.33x bad weight x bad count (KTO paper).",
    )
    undesirable_weight: float = SftField(
        1.0,
        gt=0,
        le=100,
        title="Bad-answer weight",
        description="KTO: the weight of the answers labelled bad (see the good-answer weight).",
    )
    simpo_gamma: float = SftField(
        0.5,
        ge=0,
        le=100,
        title="SimPO margin",
        description="SimPO: the reward margin the chosen answer should win by (gamma, in the units of beta's "
        "reward); its paper keeps gamma/beta about 0.5, e.g. 1.0 with beta 2. TRL's default is 0.5.",
    )
    precompute_ref_log_probs: bool = SftField(
        False,
        title="Score the reference first",
        description="Score every row with the reference before the first step and keep the scores: a full "
        "fine-tune then holds no reference copy on the GPUs, and each step skips the reference's forward pass; "
        "costs one pass over the data at the start.",
    )
