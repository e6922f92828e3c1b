"""The job spec's sections on how a job runs (strategy, launch) and the JobSpec as a whole.

The strategy kinds and their properties come from the strategy table (backend/recipe/vocabulary.py);
launch's Slurm part (the #SBATCH lines) is in backend/spec/slurm.py; the sections on what is
trained are in backend/spec/sections.py and backend/spec/training.py.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator

from tunedeck.backend.recipe.layout import FsdpSharding, Layout
from tunedeck.backend.recipe.objectives_table import OBJECTIVES, objectives_described, section_described
from tunedeck.backend.recipe.vocabulary import STRATEGIES, Strategy
from tunedeck.backend.spec.env import entries_from_text, entry_name
from tunedeck.backend.spec.grpo import GrpoSpec
from tunedeck.backend.spec.sections import (
    BASIC,
    MAX_ELEMENTS,
    DatasetSpec,
    Elements,
    LoraSpec,
    ModelSpec,
    QuantizationSpec,
    SftField,
    SpecSection,
    unique_entries,
)
from tunedeck.backend.spec.skypilot import SkyPilotSpec
from tunedeck.backend.spec.slurm import SlurmSpec
from tunedeck.backend.spec.training import PreferenceSpec, TrainingSpec

if TYPE_CHECKING:  # Literals built from the tables are ones pydantic checks at run time; the type checker reads str
    StrategyKind = str
    ObjectiveName = str
else:
    StrategyKind = Literal[tuple(STRATEGIES)]
    ObjectiveName = Literal[tuple(OBJECTIVES)]
OffloadDevice = Literal["none", "cpu", "nvme"]
_KINDS = "; ".join(f"{s.kind}: {s.title}" for s in STRATEGIES.values())


class StrategySpec(SpecSection):
    kind: StrategyKind = Field(
        default="ddp", title="Strategy", json_schema_extra=BASIC, description=f"How GPUs share the work: {_KINDS}."
    )
    offload_optimizer: OffloadDevice = Field(
        default="none",
        title="Offload optimizer",
        json_schema_extra=BASIC,
        description="Move optimizer states off the GPU (ZeRO-1/2/3: cpu or nvme; FSDP: with parameters only).",
    )
    offload_params: OffloadDevice = Field(
        default="none",
        title="Offload parameters",
        json_schema_extra=BASIC,
        description="Move parameters off the GPU between uses (ZeRO-3: cpu or nvme; FSDP: cpu). Slow: last resort.",
    )
    nvme_path: str | None = Field(
        default=None,
        title="NVMe folder",
        json_schema_extra=BASIC,
        description="Fast local disk folder for NVMe offload, e.g. /local_nvme.",
    )
    sequence_parallel: int = Field(
        default=1,
        ge=1,
        le=64,
        title="GPUs per sequence",
        json_schema_extra=BASIC,
        description="Sequence parallelism (DeepSpeed Ulysses, SFT): this many GPUs share each sequence, each "
        "holding 1/N of its activations, for rows too long for one GPU; attention heads are exchanged "
        "all-to-all. 1: off. The global batch is divided by it.",
    )
    overlap_comm: bool = Field(
        default=True,
        title="Overlap communication",
        description="DeepSpeed: overlap gradient reduction with the backward pass.",
    )
    contiguous_gradients: bool = Field(
        default=True,
        title="Contiguous gradients",
        description="DeepSpeed: copy gradients to one buffer to avoid fragmentation.",
    )
    reduce_bucket_size: Elements | Literal["auto"] = Field(
        default="auto",
        title="Reduce bucket size",
        description="DeepSpeed: elements per gradient reduction bucket; auto = hidden_size^2.",
    )
    allgather_bucket_size: int = Field(
        default=500_000_000,
        ge=1,
        le=MAX_ELEMENTS,
        title="All-gather bucket size",
        description="DeepSpeed ZeRO-1/2: elements per parameter all-gather bucket.",
    )
    stage3_prefetch_bucket_size: Elements | Literal["auto"] = Field(
        default="auto",
        title="Prefetch bucket size",
        description="ZeRO-3: parameters prefetched ahead of use; auto = 0.9 x hidden_size^2.",
    )
    stage3_param_persistence_threshold: Annotated[int, Field(ge=0, le=MAX_ELEMENTS)] | Literal["auto"] = Field(
        default="auto",
        title="Persistence threshold",
        description="ZeRO-3: parameters smaller than this stay unsharded; auto = 10 x hidden_size.",
    )
    stage3_max_live_parameters: int = Field(
        default=1_000_000_000,
        ge=1,
        le=MAX_ELEMENTS,
        title="Max live parameters",
        description="ZeRO-3: most parameters resident on a GPU at once.",
    )
    stage3_max_reuse_distance: int = Field(
        default=1_000_000_000,
        ge=0,
        le=MAX_ELEMENTS,
        title="Max reuse distance",
        description="ZeRO-3: keep a parameter if it is reused within this many parameters.",
    )
    stage3_gather_16bit_weights_on_model_save: bool = Field(
        default=True,
        title="Save gathered 16-bit weights",
        description="ZeRO-3: gather full 16-bit weights when saving, so the saved model loads without DeepSpeed.",
    )
    fsdp_version: Literal[1, 2] = Field(
        default=2,
        title="FSDP version",
        description="FSDP implementation: 2 (per-parameter sharding, fully_shard) or 1.",
    )
    fsdp_sharding_strategy: FsdpSharding = Field(
        default="FULL_SHARD",
        title="FSDP sharding",
        description="FSDP: FULL_SHARD (like ZeRO-3), SHARD_GRAD_OP (like ZeRO-2), HYBRID_SHARD (shard inside a node, replicate across nodes).",
    )
    fsdp_transformer_layer_cls_to_wrap: str | None = Field(
        default=None,
        title="Layer class to wrap",
        description="FSDP: decoder layer class to wrap, e.g. LlamaDecoderLayer; empty takes it from the model's architecture.",
    )
    fsdp_activation_checkpointing: bool = Field(
        default=False,
        title="FSDP activation checkpointing",
        json_schema_extra=BASIC,
        description="FSDP: checkpoint activations inside FSDP (use instead of training.gradient_checkpointing).",
    )
    fsdp_state_dict_type: Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"] = Field(
        default="SHARDED_STATE_DICT",
        title="Checkpoint layout",
        description="FSDP: checkpoint layout; sharded saves fast, full is one file per model.",
    )
    fsdp_cpu_ram_efficient_loading: bool = Field(
        default=True,
        title="RAM-efficient loading",
        description="FSDP: rank 0's weights are broadcast to the other ranks when sharding (they skip initialising their own). With transformers 5 every rank still reads the checkpoint into host RAM; ignored for 4-bit models.",
    )

    @property
    def facts(self) -> Strategy:
        """The strategy table's row of this kind (backend/recipe/vocabulary.py)."""
        return STRATEGIES[self.kind]

    @property
    def is_deepspeed(self) -> bool:
        return self.facts.is_deepspeed

    @property
    def zero_stage(self) -> int | None:
        return self.facts.zero_stage


class LaunchSpec(SpecSection):
    backend: Literal["local", "slurm", "skypilot"] = Field(
        default="local",
        title="Where to run",
        json_schema_extra=BASIC,
        description="Where the run goes: local (this machine, or launch.sh on each machine), slurm (submitted with "
        "sbatch) or skypilot (a SkyPilot managed job on Kubernetes or a cloud: sky jobs launch sky.yaml).",
    )
    num_machines: int = Field(
        default=1, ge=1, le=4096, title="Machines", json_schema_extra=BASIC, description="Nodes taking part in the run."
    )
    num_processes: int = Field(
        default=1,
        ge=1,
        le=65536,
        title="Processes (GPUs)",
        json_schema_extra=BASIC,
        description="Processes (GPUs) in total across all machines.",
    )
    gpu_ids: str = Field(
        default="all",
        title="GPUs to use",
        json_schema_extra=BASIC,
        description="GPUs to use on each machine: all, or a list such as 0,1,2,3.",
    )
    machine_rank: int = Field(
        default=0,
        ge=0,
        le=4095,
        title="This machine's rank",
        json_schema_extra=BASIC,
        description="Rank of this machine, 0 to num_machines-1 (0 is the main node).",
    )
    main_process_ip: str | None = Field(
        default=None,
        title="Main node address",
        json_schema_extra=BASIC,
        description="Address of the main node (machine rank 0); needed with several machines.",
    )
    main_process_port: int = Field(
        default=29500, ge=1, le=65535, title="Main node port", description="Port of the main node's rendezvous."
    )
    rdzv_backend: Literal["static", "c10d"] = Field(
        default="static",
        title="Rendezvous",
        description="Rendezvous: static (fixed ranks) or c10d (elastic, for schedulers).",
    )
    same_network: bool = Field(
        default=True, title="Same network", description="All machines are on the same local network."
    )
    use_cpu: bool = Field(
        default=False,
        title="CPU only",
        json_schema_extra=BASIC,
        description="Train on CPU processes (gloo backend), for machines without a GPU: the demo and tests.",
    )
    stall_minutes: float = Field(
        default=10.0,
        ge=0,
        le=10080,
        title="Stalled after (minutes)",
        description="With no training step for this long (and for 3x the longest gap seen, such as an evaluation; "
        "checkpoint saves do not count), each rank writes every thread's Python stack to its log and the run is "
        "marked stalled; 0: never.",
    )
    stop_when_stalled: bool = Field(
        default=False,
        title="Stop a stalled run",
        description="End a stalled run as failed (its processes end, its GPUs are freed) instead of waiting; "
        "keep stall_minutes above your longest step.",
    )
    network_check: bool | None = Field(
        default=None,
        title="Measure the network first",
        description="Before the model loads, all-reduce 1 to 64 MiB across the ranks for a few seconds and record "
        "the bus bandwidth, over every rank and within each machine (nccl-tests' measure) in the start record; "
        "empty: on for a job on more than one machine.",
    )
    max_restarts: int = Field(
        default=2,
        ge=0,
        le=100,
        title="Restarts after a failure",
        description="How often a failed run starts again by itself, from its newest checkpoint, when a new attempt "
        "can cure the failure: a lost rank or connection, a timeout (unknown causes once). Out of memory, data and "
        "configuration errors are never retried. 0: never.",
    )
    restart_backoff_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        title="Wait before a restart (s)",
        description="Seconds before the first restart, doubled for each one after it (at most 10 minutes).",
    )
    env: Annotated[list[str], Field(max_length=64)] = Field(
        default_factory=list,
        title="Environment variables",
        description="Set for every rank, as NAME=VALUE entries, e.g. NCCL_SOCKET_IFNAME=eth0, NCCL_DEBUG=INFO, "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Not the launcher's own (RANK, MASTER_ADDR ...) nor "
        "secrets (tokens stay in your shell's environment, which the ranks inherit).",
    )
    slurm: SlurmSpec = Field(
        default_factory=SlurmSpec, title="Slurm", description="Slurm submission (launch.backend=slurm)."
    )
    skypilot: SkyPilotSpec = Field(
        default_factory=SkyPilotSpec,
        title="SkyPilot",
        description="The SkyPilot task (sky.yaml) and managed job (launch.backend=skypilot).",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_from_text(cls, value: Any) -> Any:
        return entries_from_text(value)

    @field_validator("env")
    @classmethod
    def _env_entries(cls, value: list[str]) -> list[str]:
        return unique_entries(value, entry_name, "{key} is set twice; keep one")

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


class JobSpec(SpecSection):
    model: ModelSpec = Field(default_factory=ModelSpec, description="Base model.")
    method: Literal["full", "lora", "qlora"] = Field(
        default="lora",
        title="Fine-tuning method",
        json_schema_extra=BASIC,
        description="full (all weights train), lora (adapters on a 16-bit base), qlora (adapters on a 4-bit base).",
    )
    objective: ObjectiveName = Field(
        default="sft",
        title="Objective",
        json_schema_extra=BASIC,
        description=objectives_described(),
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapter (lora and qlora).")
    quantization: QuantizationSpec = Field(
        default_factory=QuantizationSpec, description="bitsandbytes quantization of the base."
    )
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Training data.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation.")
    preference: PreferenceSpec = Field(
        default_factory=PreferenceSpec, description=f"Preference training ({section_described('preference')})."
    )
    grpo: GrpoSpec = Field(default_factory=GrpoSpec, description="Learning from rewards (objective=grpo).")
    strategy: StrategySpec = Field(default_factory=StrategySpec, description="How the work is split across GPUs.")
    launch: LaunchSpec = Field(default_factory=LaunchSpec, description="Processes and machines.")
    output_dir: str = SftField(
        "output",
        min_length=1,
        title="Output folder",
        basic=True,
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
            raise ValueError(
                "'..' leads out of the run folder: name a folder inside it (e.g. output) or give an absolute path"
            )
        if not path.parts:
            raise ValueError("this is the run folder itself, where the logs are: name a folder inside it, e.g. output")
        return value

    @property
    def uses_adapter(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step across all processes (the GPUs sharing a sequence count once)."""
        t = self.training
        return t.per_device_train_batch_size * self.data_parallel_size * t.gradient_accumulation_steps

    @property
    def layout(self) -> Layout:
        """How the job lays the model out over processes and machines (backend/recipe/layout.py)."""
        return Layout.of({"strategy": dict(self.strategy), "launch": dict(self.launch)})

    @property
    def sequence_parallel(self) -> int:
        """GPUs sharing each sequence: strategy.sequence_parallel where it applies (DeepSpeed), else 1."""
        return self.layout.sequence_parallel

    @property
    def data_parallel_size(self) -> int:
        """Processes that each read their own rows: all of them, over the GPUs that share a sequence."""
        return self.layout.data_parallel_size
