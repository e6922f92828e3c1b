"""How a job lays its model out over processes and machines: one `Layout`, computed once from the job.

The strategy table (backend/recipe/vocabulary.py) says what each strategy.kind is; the Layout adds what the
rest of the job decides: FSDP's sub-strategy, the offload a strategy really does, the processes and machines,
the GPUs that share a sequence (DeepSpeed Ulysses). Validation, the bundle's files, the memory and speed
models, the advisor and the recipe's sanity gate read its properties instead of comparing engine strings.

It is computed from plain data, the job as job.yaml holds it (tunedeck's JobSpec.layout passes its own
sections), because this module ships in every bundle with the recipe: standard library only, pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .vocabulary import STRATEGIES, Strategy

FsdpSharding = Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"]


@dataclass(frozen=True)
class Layout:
    strategy: Strategy  # the strategy table's row of strategy.kind
    fsdp_sharding: FsdpSharding | None  # FSDP's sub-strategy (strategy.fsdp_sharding_strategy); None off FSDP
    fsdp_version: int | None  # 1 or 2 under FSDP; None off FSDP
    offload_optimizer: str  # "none", "cpu" or "nvme": "none" where the strategy cannot offload it at all
    offload_params: str  # likewise for the parameters
    world_size: int  # processes in all (launch.num_processes)
    machines: int  # launch.num_machines
    sequence_parallel: int  # GPUs sharing each sequence: strategy.sequence_parallel under DeepSpeed, else 1
    tensor_parallel: int = 1  # GPUs sharing each layer's weights: no strategy splits layers yet

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> Layout:
        """The layout of a job given as job.yaml holds it ({"strategy": {...}, "launch": {...}, ...}); a missing
        section or key reads as the spec's default. KeyError for a strategy.kind the table does not have."""
        strategy, launch = job.get("strategy") or {}, job.get("launch") or {}
        row = STRATEGIES[strategy.get("kind", "ddp")]
        fsdp = row.is_fsdp
        return cls(
            strategy=row,
            fsdp_sharding=strategy.get("fsdp_sharding_strategy", "FULL_SHARD") if fsdp else None,
            fsdp_version=int(strategy.get("fsdp_version", 2)) if fsdp else None,
            # A strategy that cannot offload ignores the field (backend/spec/applies.py hides it).
            offload_optimizer=strategy.get("offload_optimizer", "none") if row.offload_optimizer else "none",
            offload_params=strategy.get("offload_params", "none") if row.offload_params else "none",
            world_size=int(launch.get("num_processes", 1)),
            machines=int(launch.get("num_machines", 1)),
            sequence_parallel=int(strategy.get("sequence_parallel", 1)) if row.is_deepspeed else 1,
        )

    @classmethod
    def of_values(cls, values: Mapping[str, Any]) -> Layout:
        """The layout of a job given as {dotted path: value} (the form's values, the estimate's variants)."""
        nested: dict[str, dict[str, Any]] = {}
        for path, value in values.items():
            section, _, name = path.partition(".")
            if section in ("strategy", "launch") and name:
                nested.setdefault(section, {})[name] = value
        return cls.of(nested)

    # ---------------------------------------------------------------- the engine

    @property
    def kind(self) -> str:
        return self.strategy.kind

    @property
    def engine(self) -> str:
        """What wraps the model: "ddp", "deepspeed" or "fsdp"."""
        return self.strategy.engine

    @property
    def wrapper(self) -> str:
        """The engine as the start record names it: "none" for one plain process (nothing wraps the model)."""
        return "none" if self.is_ddp and self.world_size == 1 else self.engine

    @property
    def zero_stage(self) -> int | None:
        return self.strategy.zero_stage

    @property
    def is_ddp(self) -> bool:
        return self.strategy.is_ddp

    @property
    def is_deepspeed(self) -> bool:
        return self.strategy.is_deepspeed

    @property
    def is_fsdp(self) -> bool:
        return self.strategy.is_fsdp

    @property
    def is_zero3(self) -> bool:
        """DeepSpeed sharding the parameters too: its hooks gather each layer's weights as it runs."""
        return self.is_deepspeed and self.shards_parameters

    # ---------------------------------------------------------------- what is sharded

    @property
    def shards_optimizer(self) -> bool:
        return "optimizer" in self.strategy.shards

    @property
    def shards_gradients(self) -> bool:
        return "gradients" in self.strategy.shards

    @property
    def shards_parameters(self) -> bool:
        """The weights are split across GPUs between steps (ZeRO-3, FSDP with any sub-strategy)."""
        return "parameters" in self.strategy.shards

    @property
    def gathers_per_layer(self) -> bool:
        """Each layer's weights are gathered for its forward and freed after it, then gathered again for its
        backward (ZeRO-3, FSDP FULL_SHARD and HYBRID_SHARD); FSDP's SHARD_GRAD_OP keeps them from forward to
        backward (FSDP2's reshard_after_forward=False)."""
        return self.shards_parameters and self.fsdp_sharding != "SHARD_GRAD_OP"

    @property
    def keeps_gathered(self) -> bool:
        """FSDP's SHARD_GRAD_OP: the weights stay gathered from a micro-step's forward to its backward."""
        return self.fsdp_sharding == "SHARD_GRAD_OP"

    @property
    def hybrid(self) -> bool:
        """FSDP's HYBRID_SHARD: sharded inside a machine, replicated across machines."""
        return self.fsdp_sharding == "HYBRID_SHARD"

    @property
    def shard_group_size(self) -> int:
        """Ranks a sharded tensor is split over: the machine's processes under HYBRID_SHARD, else all."""
        return self.processes_per_machine if self.hybrid else self.world_size

    @property
    def replicas(self) -> int:
        """Copies of each shard: one per machine under HYBRID_SHARD, else one (or every process, unsharded)."""
        if not self.strategy.shards:
            return self.world_size
        return self.machines if self.hybrid else 1

    # ---------------------------------------------------------------- offload

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_params != "none"

    @property
    def offloads_to_nvme(self) -> bool:
        return "nvme" in (self.offload_optimizer, self.offload_params)

    # ---------------------------------------------------------------- processes

    @property
    def processes_per_machine(self) -> int:
        return max(1, self.world_size // self.machines)

    @property
    def data_parallel_size(self) -> int:
        """Processes that each read their own rows: all of them, over the GPUs that share a sequence or a layer."""
        return max(1, self.world_size // (self.sequence_parallel * self.tensor_parallel))
