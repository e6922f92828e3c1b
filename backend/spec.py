"""The job spec: one typed, validated description of a fine-tuning job.

Presets, forms, uploaded YAML and the CLI all produce a JobSpec; every generated
file is a pure function of one. Field names follow the Hugging Face name wherever
one exists (PEFT's LoraConfig, bitsandbytes' BitsAndBytesConfig, TRL's SFTConfig,
accelerate's launch options), so a reader of either side recognises the other.

This module checks what one field alone can check (types, ranges, choices, one line of
visible text, an output folder that stays in the run folder); rules across fields live in
validate.py, and reading untrusted YAML in untrusted.py. It is longer than most modules
because the fields and the one registry that the form, `--set` and the docs walk belong
together.
"""

from __future__ import annotations

import copy
from importlib.resources import files
from pathlib import Path, PurePosixPath
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunedeck.backend.untrusted import YamlRefused, describe_char, load_yaml, shown, unsafe_char

Dtype = Literal["bfloat16", "float16", "float32"]
StrategyKind = Literal["ddp", "zero1", "zero2", "zero3", "fsdp"]
OffloadDevice = Literal["none", "cpu", "nvme"]
DEEPSPEED_KINDS = ("zero1", "zero2", "zero3")

# Upper bounds that no real job reaches, so that a form cannot ask for the absurd (an ETA of
# 10^24 hours, a 5,000-digit seed the trainer refuses only after loading the model).
MAX_STEPS = 10_000_000  # optimizer steps; Llama 2's pretraining took 500,000
MAX_ELEMENTS = 10**12  # DeepSpeed bucket and parameter counts: more than any model's parameters
MAX_TEXT = 4096  # characters in one text field: PATH_MAX on Linux, longer than any name or path
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Elements = Annotated[int, Field(ge=1, le=MAX_ELEMENTS)]


class _Section(BaseModel):
    # Unknown keys are typos: refuse them rather than silently ignore them. inf/nan pass the
    # range checks of some fields, then crash the trainer (math.ceil(inf epochs)): refuse them too.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value: Any) -> Any:
        """Every text of the spec (str fields and list items): one line of visible characters.

        Spec values reach shell scripts, YAML files and terminals; a newline in one ended a
        comment of launch.sh and ran the next line (issue 8). One check here covers every
        field, including ones added later.
        """
        items = value if isinstance(value, list) else [value]
        for number, text in enumerate(items, start=1):
            if not isinstance(text, str):
                continue
            which = f"item {number} " if isinstance(value, list) else ""
            if len(text) > MAX_TEXT:
                raise ValueError(f"{which}is {len(text):,} characters long; no name or path is longer than {MAX_TEXT}")
            index = unsafe_char(text)
            if index is not None:
                raise ValueError(
                    f"{which}contains {describe_char(text[index])} at character {index + 1}: "
                    "a text field is one line of visible characters; remove it"
                )
        return value


class ModelSpec(_Section):
    name_or_path: str = Field(
        "meta-llama/Llama-2-7b-hf",
        min_length=1,
        description="Hugging Face hub id or local folder of the base model (config.json, weights, tokenizer).",
    )
    dtype: Dtype = Field(
        "bfloat16",
        description="dtype the base weights are loaded in (from_pretrained dtype). bfloat16 needs an Ampere or newer GPU.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa",
        description="Attention kernel: sdpa (PyTorch built-in, works everywhere), flash_attention_2 (needs the flash-attn package and a 16-bit dtype), eager.",
    )
    trust_remote_code: bool = Field(
        False, description="Run Python code shipped with the model repository. Only for repositories you trust."
    )
    revision: str | None = Field(None, description="Hub branch, tag or commit of the model; empty for the default branch.")


class LoraSpec(_Section):
    r: int = Field(16, ge=1, le=1024, description="LoRA rank: size of the low-rank update. 8-64 is typical.")
    lora_alpha: int = Field(
        32, ge=1, le=4096, description="LoRA scaling numerator (update scaled by lora_alpha / r). Usually 2 x r."
    )
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input, 0 to <1. 0.05 is typical.")
    target_modules: Union[Literal["all-linear"], Annotated[list[str], Field(max_length=1000)]] = Field(
        "all-linear",
        description="Modules that get adapters: 'all-linear' or module names such as q_proj,k_proj,v_proj,o_proj.",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="Which biases are trained.")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA): a little better, slower per step.")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        # Forms and --set give "q_proj, v_proj"; PEFT wants a list (or the "all-linear" shortcut).
        if isinstance(value, str) and value.strip() != "all-linear":
            return [part.strip() for part in value.split(",") if part.strip()]
        return value.strip() if isinstance(value, str) else value


class QuantizationSpec(_Section):
    bits: Literal[4, 8] | None = Field(
        None, description="Load the base model quantized with bitsandbytes: 4 (QLoRA), 8, or empty for no quantization."
    )
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit data type. NF4 suits normally distributed weights (QLoRA paper)."
    )
    bnb_4bit_use_double_quant: bool = Field(
        True, description="Quantize the quantization constants too: saves about 0.37 bits per parameter."
    )
    bnb_4bit_compute_dtype: Dtype = Field(
        "bfloat16", description="dtype of the matmuls on dequantized 4-bit weights."
    )
    bnb_4bit_quant_storage: Literal["uint8", "bfloat16", "float16", "float32"] = Field(
        "uint8",
        description="Storage dtype of packed 4-bit weights. ZeRO-3 and FSDP need it equal to the compute dtype so they can shard it.",
    )


class DatasetSpec(_Section):
    path: str = Field(
        "timdettmers/openassistant-guanaco",
        min_length=1,
        description="Local JSON/JSONL/CSV/Parquet file or folder, or a Hugging Face hub dataset id.",
    )
    name: str | None = Field(None, description="Dataset configuration name on the hub, if it has several.")
    split: str = Field("train", min_length=1, description="Training split; slices work, e.g. train[:95%].")
    eval_split: str | None = Field(
        None, description="Evaluation split, e.g. test or train[95%:]; empty for no evaluation."
    )
    format: Literal["text", "prompt-completion", "messages", "alpaca"] = Field(
        "text",
        description="Record layout: text (one text field), prompt-completion, messages (chat, uses the chat template), alpaca (instruction/input/output).",
    )
    text_field: str = Field("text", description="Column holding the text (format text).")
    prompt_field: str = Field("prompt", description="Column holding the prompt (format prompt-completion).")
    completion_field: str = Field("completion", description="Column holding the completion (format prompt-completion).")
    messages_field: str = Field("messages", description="Column holding the chat messages (format messages).")
    instruction_field: str = Field("instruction", description="Column holding the instruction (format alpaca).")
    input_field: str = Field("input", description="Column holding the optional input (format alpaca).")
    output_field: str = Field("output", description="Column holding the answer (format alpaca).")
    max_seq_length: int = Field(
        2048, ge=8, le=1_048_576, description="Longest sequence in tokens; longer examples are truncated."
    )
    packing: bool = Field(
        False, description="Pack several short examples into one sequence: no padding waste, higher throughput."
    )


class TrainingSpec(_Section):
    num_train_epochs: float = Field(
        1.0, gt=0, le=10_000, description="Passes over the training data (ignored when max_steps > 0)."
    )
    max_steps: int = Field(
        -1, ge=-1, le=MAX_STEPS, description="Stop after this many optimizer steps; -1 trains for num_train_epochs."
    )
    learning_rate: float = Field(2e-4, gt=0, lt=1, description="Peak learning rate. LoRA: 1e-4 to 3e-4; full fine-tuning: 1e-5 to 2e-5.")
    lr_scheduler_type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
    ] = Field("cosine", description="Learning-rate schedule after warmup.")
    warmup_steps: float = Field(
        0.03, ge=0, le=MAX_STEPS, description="Warmup: whole steps, or a fraction of all steps when below 1 (0.03 = 3%)."
    )
    per_device_train_batch_size: int = Field(
        1, ge=1, le=4096, description="Micro batch per GPU per forward pass. Keep small; raise gradient accumulation instead."
    )
    per_device_eval_batch_size: int = Field(1, ge=1, le=4096, description="Micro batch per GPU for evaluation.")
    gradient_accumulation_steps: int = Field(
        8, ge=1, le=4096, description="Micro batches summed before each optimizer step."
    )
    gradient_checkpointing: bool = Field(
        True, description="Recompute activations in the backward pass: much less memory, about 30% slower."
    )
    precision: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="Mixed precision of training: bf16 (Ampere or newer), fp16 (older GPUs, loss scaling), fp32 (CPU)."
    )
    optim: Literal[
        "adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "adafactor", "sgd"
    ] = Field("adamw_torch", description="Optimizer (transformers name). 8-bit and paged variants need bitsandbytes.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="Decoupled weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, le=1e6, description="Gradient clipping norm; 0 disables clipping.")
    # numpy (seeded by transformers.set_seed) takes 0 to 2**32-1, and says so only after the model loaded.
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Random seed for data order and adapter initialisation.")
    logging_steps: Steps = Field(10, description="Log loss and learning rate every this many steps.")
    save_steps: Steps = Field(500, description="Save a checkpoint every this many steps.")
    save_total_limit: int | None = Field(
        2, ge=1, le=100_000, description="Keep at most this many checkpoints; empty keeps all."
    )
    eval_steps: Steps | None = Field(
        None, description="Evaluate every this many steps (needs an eval split); empty uses logging_steps."
    )
    report_to: Literal["none", "tensorboard", "wandb", "mlflow", "trackio"] = Field(
        "none", description="Extra experiment tracker; tunedeck's own metrics are always written."
    )
    ddp_find_unused_parameters: bool = Field(
        False, description="Let DDP search for parameters without gradients. False for LoRA (frozen base), faster."
    )
    resume_from_checkpoint: bool = Field(
        False, description="Continue from the newest checkpoint in the output folder, if there is one."
    )


class StrategySpec(_Section):
    kind: StrategyKind = Field(
        "ddp",
        description="ddp (full copy per GPU), zero1/zero2/zero3 (DeepSpeed sharding of optimizer / +gradients / +parameters), fsdp (PyTorch sharding).",
    )
    offload_optimizer: OffloadDevice = Field(
        "none", description="Move optimizer states off the GPU (ZeRO-1/2/3: cpu or nvme; FSDP: with parameters only)."
    )
    offload_params: OffloadDevice = Field(
        "none", description="Move parameters off the GPU between uses (ZeRO-3: cpu or nvme; FSDP: cpu). Slow: last resort."
    )
    nvme_path: str | None = Field(None, description="Fast local disk folder for NVMe offload, e.g. /local_nvme.")
    overlap_comm: bool = Field(True, description="DeepSpeed: overlap gradient reduction with the backward pass.")
    contiguous_gradients: bool = Field(True, description="DeepSpeed: copy gradients to one buffer to avoid fragmentation.")
    reduce_bucket_size: Union[Elements, Literal["auto"]] = Field(
        "auto", description="DeepSpeed: elements per gradient reduction bucket; auto = hidden_size^2."
    )
    allgather_bucket_size: int = Field(
        500_000_000, ge=1, le=MAX_ELEMENTS, description="DeepSpeed ZeRO-1/2: elements per parameter all-gather bucket."
    )
    stage3_prefetch_bucket_size: Union[Elements, Literal["auto"]] = Field(
        "auto", description="ZeRO-3: parameters prefetched ahead of use; auto = 0.9 x hidden_size^2."
    )
    stage3_param_persistence_threshold: Union[Annotated[int, Field(ge=0, le=MAX_ELEMENTS)], Literal["auto"]] = Field(
        "auto", description="ZeRO-3: parameters smaller than this stay unsharded; auto = 10 x hidden_size."
    )
    stage3_max_live_parameters: int = Field(
        1_000_000_000, ge=1, le=MAX_ELEMENTS, description="ZeRO-3: most parameters resident on a GPU at once."
    )
    stage3_max_reuse_distance: int = Field(
        1_000_000_000, ge=0, le=MAX_ELEMENTS, description="ZeRO-3: keep a parameter if it is reused within this many parameters."
    )
    stage3_gather_16bit_weights_on_model_save: bool = Field(
        True, description="ZeRO-3: gather full 16-bit weights when saving, so the saved model loads without DeepSpeed."
    )
    fsdp_version: Literal[1, 2] = Field(2, description="FSDP implementation: 2 (per-parameter sharding, fully_shard) or 1.")
    fsdp_sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"] = Field(
        "FULL_SHARD",
        description="FSDP: FULL_SHARD (like ZeRO-3), SHARD_GRAD_OP (like ZeRO-2), HYBRID_SHARD (shard inside a node, replicate across nodes).",
    )
    fsdp_transformer_layer_cls_to_wrap: str | None = Field(
        None, description="FSDP: decoder layer class to wrap, e.g. LlamaDecoderLayer; empty takes it from the model's architecture."
    )
    fsdp_activation_checkpointing: bool = Field(
        False, description="FSDP: checkpoint activations inside FSDP (use instead of training.gradient_checkpointing)."
    )
    fsdp_state_dict_type: Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"] = Field(
        "SHARDED_STATE_DICT", description="FSDP: checkpoint layout; sharded saves fast, full is one file per model."
    )
    fsdp_cpu_ram_efficient_loading: bool = Field(
        True,
        description="FSDP: rank 0's weights are broadcast to the other ranks when sharding (they skip initialising their own). With transformers 5 every rank still reads the checkpoint into host RAM; ignored for 4-bit models.",
    )

    @property
    def is_deepspeed(self) -> bool:
        return self.kind in DEEPSPEED_KINDS

    @property
    def zero_stage(self) -> int | None:
        return int(self.kind[-1]) if self.is_deepspeed else None


class LaunchSpec(_Section):
    num_machines: int = Field(1, ge=1, le=4096, description="Nodes taking part in the run.")
    num_processes: int = Field(
        1, ge=1, le=65536, description="Processes (GPUs) in total across all machines."
    )
    gpu_ids: str = Field("all", description="GPUs to use on each machine: all, or a list such as 0,1,2,3.")
    machine_rank: int = Field(0, ge=0, le=4095, description="Rank of this machine, 0 to num_machines-1 (0 is the main node).")
    main_process_ip: str | None = Field(None, description="Address of the main node (machine rank 0); needed with several machines.")
    main_process_port: int = Field(29500, ge=1, le=65535, description="Port of the main node's rendezvous.")
    rdzv_backend: Literal["static", "c10d"] = Field(
        "static", description="Rendezvous: static (fixed ranks) or c10d (elastic, for schedulers)."
    )
    same_network: bool = Field(True, description="All machines are on the same local network.")
    use_cpu: bool = Field(
        False, description="Train on CPU processes (gloo backend), for machines without a GPU: the demo and tests."
    )

    @field_validator("gpu_ids", mode="before")
    @classmethod
    def _normalise_gpu_ids(cls, value: Any) -> Any:
        # YAML reads "0" as 0 and "0,1" may arrive as a list; keep one canonical string. Anything
        # else (a 5,000-digit number cannot even be printed) goes on for the type check to name.
        def gpu_id(item: Any) -> bool:
            return isinstance(item, str) or (type(item) is int and 0 <= item < 10**6)

        if isinstance(value, list) and all(gpu_id(v) for v in value):
            return ",".join(str(v) for v in value)
        if type(value) is int and gpu_id(value):
            return str(value)
        return value.replace(" ", "") if isinstance(value, str) else value

    @property
    def processes_per_machine(self) -> int:
        return max(1, self.num_processes // self.num_machines)


class JobSpec(_Section):
    model: ModelSpec = Field(default_factory=ModelSpec, description="Base model.")
    method: Literal["full", "lora", "qlora"] = Field(
        "lora", description="full (all weights train), lora (adapters on a 16-bit base), qlora (adapters on a 4-bit base)."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapter (lora and qlora).")
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec, description="bitsandbytes quantization of the base.")
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Training data.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation.")
    strategy: StrategySpec = Field(default_factory=StrategySpec, description="How the work is split across GPUs.")
    launch: LaunchSpec = Field(default_factory=LaunchSpec, description="Processes and machines.")
    output_dir: str = Field(
        "output",
        min_length=1,
        description="Where checkpoints and the final model go: a folder inside the run folder (e.g. output), or an "
        "absolute path you choose (the run writes there, as shown here). No '..'.",
    )

    @field_validator("output_dir")
    @classmethod
    def _confined(cls, value: str) -> str:
        # A relative output_dir is resolved in the run folder (train.py chdirs there); `..` would
        # write beside other runs or anywhere above. An absolute (or ~) path is the user's own choice.
        path = PurePosixPath(value)
        if ".." in path.parts:
            raise ValueError("'..' leads out of the run folder: name a folder inside it (e.g. output) or give an absolute path")
        if not path.parts:
            raise ValueError("this is the run folder itself, where the logs are: name a folder inside it, e.g. output")
        return value

    @property
    def uses_adapter(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step across all processes."""
        t = self.training
        return t.per_device_train_batch_size * self.launch.num_processes * t.gradient_accumulation_steps


# ---------------------------------------------------------------- YAML round trip


def spec_to_dict(spec: JobSpec) -> dict:
    return spec.model_dump(mode="json")


def spec_to_yaml(spec: JobSpec) -> str:
    return yaml.safe_dump(spec_to_dict(spec), sort_keys=False, allow_unicode=True)


def spec_from_dict(data: dict) -> JobSpec:
    return JobSpec.model_validate(data)


def spec_from_yaml(text: str) -> JobSpec:
    """Parse YAML text into a JobSpec. Raises SpecError with field-level messages."""
    try:
        data = load_yaml(text)
    except YamlRefused as exc:
        raise SpecError([(exc.path, exc.message)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError([("", "a job spec is a YAML mapping (key: value lines) at the top level")])
    return parse_spec(data)


def load_spec_file(path: str | Path) -> JobSpec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, or not a text file at all
        raise SpecError([("", f"cannot read {path} as a UTF-8 YAML job spec: {exc}")]) from None
    return spec_from_yaml(text)


# ---------------------------------------------------------------- errors people can act on


class SpecError(ValueError):
    """A spec that does not parse: a list of (dotted field path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path or 'spec'}: {msg}" for path, msg in problems))


def _describe_pydantic_error(err: dict) -> tuple[str, str]:
    # Union members add their type to the location ("target_modules.list[str]"): keep field names only.
    path = ".".join(str(p) for p in err["loc"] if isinstance(p, str) and p in _ALL_FIELD_NAMES)
    if err["type"] == "extra_forbidden":
        path = ".".join(shown(p) for p in err["loc"])  # the input's own key: may hold anything
        return path, "unknown field; check its spelling (`tunedeck schema` lists every field)"
    # A check of ours raised ValueError: its message without pydantic's "Value error, " prefix.
    msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
    field = field_info(path)
    if field is not None and field.description:
        msg = f"{msg}. ({field.description})"
    return path, msg


MAX_PROBLEMS = 20  # a file of 10,000 unknown keys gets a readable answer, not 10,000 lines


def parse_spec(data: dict) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        seen: dict[str, str] = {}
        for err in exc.errors(include_input=False, include_url=False):
            path, msg = _describe_pydantic_error(err)
            seen.setdefault(path, msg)  # one message per field: union members repeat themselves
        problems = list(seen.items())
        if len(problems) > MAX_PROBLEMS:
            problems = problems[:MAX_PROBLEMS] + [("", f"and {len(problems) - MAX_PROBLEMS} more problems like these")]
        raise SpecError(problems) from None


# ---------------------------------------------------------------- field registry


def iter_fields(model: type[BaseModel] = JobSpec, prefix: str = ""):
    """Yield (dotted_path, FieldInfo) for every leaf field of the spec, in declaration order.

    The form, `--set` and the docs all come from this one walk.
    """
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from iter_fields(annotation, prefix=f"{path}.")
        else:
            yield path, info


def field_info(path: str):
    """FieldInfo of a dotted leaf path, or None when there is no such field."""
    model: type[BaseModel] = JobSpec
    parts = path.split(".")
    for i, part in enumerate(parts):
        info = model.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        if i == len(parts) - 1:
            return info
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return None


FIELD_PATHS = [path for path, _ in iter_fields()]
_ALL_FIELD_NAMES = {part for path in FIELD_PATHS for part in path.split(".")}


def get_path(spec: JobSpec, path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def set_paths(spec: JobSpec | dict, assignments: dict[str, Any]) -> JobSpec:
    """Return a new spec with dotted paths set, validated as a whole.

    Values may be strings (from --set or a form); they are read as YAML scalars
    so "8", "true", "null" and "[q_proj, v_proj]" become the right types.
    Raises SpecError naming the field.
    """
    data = copy.deepcopy(spec_to_dict(spec) if isinstance(spec, JobSpec) else spec)
    problems = []
    for path, value in assignments.items():
        if path not in FIELD_PATHS:
            problems.append((shown(path), f"unknown field; known fields: {', '.join(_close_matches(path))}"))
            continue
        if isinstance(value, str):
            value = _read_scalar(value, keep_text=_takes_text(path))
        set_dotted(data, path, value)
    if problems:
        raise SpecError(problems)
    return parse_spec(data)


def set_dotted(data: dict, path: str, value: Any) -> None:
    """data["a"]["b"] = value for path "a.b", creating the sections on the way."""
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def parse_assignments(items: list[str]) -> dict[str, str]:
    """Turn ["a.b=1", ...] into {"a.b": "1"}; raises SpecError on a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise SpecError([(shown(item), "expected dotted.path=value, e.g. --set strategy.kind=zero2")])
        out[path.strip()] = value.strip()
    return out


def _read_scalar(text: str, keep_text: bool = False) -> Any:
    if text == "":
        return None
    if unsafe_char(text) is not None:  # YAML would fold a raw line break into a space: keep it, to be refused
        return text
    try:
        value = load_yaml(text)
    except YamlRefused:  # not YAML (or nested, aliased, ...): the text as typed, which the field's type then judges
        return text
    # A text field keeps what was typed: a revision 0123456, a split or folder named 2024.
    if keep_text and value is not None and not isinstance(value, str):
        return text
    return value


def _takes_text(path: str) -> bool:
    """The field is plain text (str or str | None), not a choice, number or list."""
    annotation = field_info(path).annotation
    return annotation is str or (get_origin(annotation) in (Union, UnionType) and str in get_args(annotation))


def _close_matches(path: str) -> list[str]:
    import difflib

    return difflib.get_close_matches(path, FIELD_PATHS, n=3, cutoff=0.5) or FIELD_PATHS[:5] + ["..."]


# ---------------------------------------------------------------- presets


# The package's own folder: the repository root in a checkout, site-packages/tunedeck when installed.
# Presets, assets and constraints.txt ship in it as package data.
PACKAGE_DIR = Path(str(files("tunedeck")))
PRESETS_DIR = PACKAGE_DIR / "presets"


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    title: str
    description: str
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
    import os

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
        raise SpecError(
            [("", f"{source!r} is neither a preset ({', '.join(presets)}) nor an existing YAML file")]
        )
    if overrides:
        spec = set_paths(spec, parse_assignments(overrides))
    return spec
