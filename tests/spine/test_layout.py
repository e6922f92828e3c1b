"""The Layout (backend/recipe/layout.py): what each strategy kind shards, offloads and replicates, on one machine
and on several, read from the job as job.yaml holds it; and the spec's own layout is the same."""

from __future__ import annotations

import itertools

import pytest
import yaml

from tunedeck.backend.recipe.layout import Layout
from tunedeck.backend.recipe.vocabulary import STRATEGIES
from tunedeck.backend.spec import resolve_spec, spec_to_yaml

# kind -> (engine, ZeRO stage, shards optimizer / gradients / parameters)
EXPECTED = {
    "ddp": ("ddp", None, (False, False, False)),
    "zero1": ("deepspeed", 1, (True, False, False)),
    "zero2": ("deepspeed", 2, (True, True, False)),
    "zero3": ("deepspeed", 3, (True, True, True)),
    "fsdp": ("fsdp", None, (True, True, True)),
}
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")
OFFLOADS = (("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("nvme", "nvme"))


def job(kind: str, machines: int = 1, per_machine: int = 8, offload=("none", "none"), **strategy) -> dict:
    return {
        "strategy": {"kind": kind, "offload_optimizer": offload[0], "offload_params": offload[1], **strategy},
        "launch": {"num_machines": machines, "num_processes": machines * per_machine},
    }


def test_every_kind_of_the_table_is_covered():
    assert set(EXPECTED) == set(STRATEGIES)


@pytest.mark.parametrize(
    ("kind", "machines", "offload", "sharding"),
    [
        (kind, machines, offload, sharding)
        for kind, machines, offload in itertools.product(EXPECTED, (1, 2), OFFLOADS)
        for sharding in (SHARDINGS if kind == "fsdp" else ("FULL_SHARD",))
    ],
)
def test_layout_of_every_kind_machines_and_offload(kind, machines, offload, sharding):
    layout = Layout.of(job(kind, machines, offload=offload, fsdp_sharding_strategy=sharding))
    engine, stage, (optimizer, gradients, parameters) = EXPECTED[kind]
    assert (layout.kind, layout.engine, layout.zero_stage) == (kind, engine, stage)
    assert (layout.is_ddp, layout.is_deepspeed, layout.is_fsdp) == (
        engine == "ddp",
        engine == "deepspeed",
        engine == "fsdp",
    )
    assert (layout.shards_optimizer, layout.shards_gradients, layout.shards_parameters) == (
        optimizer,
        gradients,
        parameters,
    )
    assert layout.is_zero3 == (kind == "zero3")
    assert (layout.world_size, layout.machines, layout.processes_per_machine) == (8 * machines, machines, 8)
    # FSDP's sub-strategy exists only under FSDP; HYBRID_SHARD shards inside a machine and replicates across them.
    assert layout.fsdp_sharding == (sharding if kind == "fsdp" else None)
    hybrid = kind == "fsdp" and sharding == "HYBRID_SHARD"
    assert layout.hybrid == hybrid
    assert layout.shard_group_size == (8 if hybrid else 8 * machines)
    assert layout.replicas == (8 * machines if kind == "ddp" else machines if hybrid else 1)
    assert layout.gathers_per_layer == (parameters and sharding != "SHARD_GRAD_OP")
    # An offload the strategy cannot do at all is no offload; one it can is taken as asked (validation refuses
    # the wrong device, e.g. NVMe under FSDP, naming the field).
    row = STRATEGIES[kind]
    want = (offload[0] if row.offload_optimizer else "none", offload[1] if row.offload_params else "none")
    assert (layout.offload_optimizer, layout.offload_params) == want
    assert layout.offloads == (want != ("none", "none"))
    assert layout.offloads_to_nvme == ("nvme" in want)
    assert (layout.sequence_parallel, layout.tensor_parallel, layout.data_parallel_size) == (1, 1, 8 * machines)


@pytest.mark.parametrize(("kind", "sequence"), [("zero2", 4), ("zero3", 4), ("ddp", 1), ("fsdp", 1)])
def test_sequence_parallel_is_deepspeed_only(kind, sequence):
    layout = Layout.of(job(kind, machines=2, sequence_parallel=4))
    assert layout.sequence_parallel == sequence
    assert layout.data_parallel_size == 16 // sequence


def test_one_plain_process_has_no_wrapper():
    assert Layout.of({}).wrapper == "none"  # every key missing: the spec's defaults, one DDP process
    assert Layout.of(job("ddp", per_machine=2)).wrapper == "ddp"
    assert Layout.of(job("zero2", per_machine=1)).wrapper == "deepspeed"


def test_an_unknown_kind_is_a_key_error():
    with pytest.raises(KeyError):
        Layout.of({"strategy": {"kind": "tensor"}})


def test_flat_values_give_the_same_layout():
    nested = job("fsdp", machines=2, offload=("cpu", "cpu"), fsdp_sharding_strategy="HYBRID_SHARD")
    flat = {f"{section}.{key}": value for section, fields in nested.items() for key, value in fields.items()}
    assert Layout.of_values({**flat, "method": "lora"}) == Layout.of(nested)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["strategy.kind=fsdp", "strategy.fsdp_sharding_strategy=HYBRID_SHARD", "launch.num_machines=2"],
        ["strategy.kind=zero3", "strategy.offload_params=nvme", "strategy.offload_optimizer=nvme"],
        ["strategy.kind=zero2", "strategy.sequence_parallel=2", "launch.num_processes=8"],
    ],
)
def test_the_spec_and_its_job_yaml_have_one_layout(sets):
    """What the recipe reads from job.yaml is what tunedeck computed from the spec."""
    spec = resolve_spec("7b-lora-ddp", sets)
    assert Layout.of(yaml.safe_load(spec_to_yaml(spec))) == spec.layout
    assert spec.data_parallel_size == spec.layout.data_parallel_size
