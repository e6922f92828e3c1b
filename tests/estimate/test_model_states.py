"""Model-state terms against DeepSpeed's own estimators and the ZeRO paper's table."""

from __future__ import annotations

import pytest
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import GIB
from tunedeck.backend.estimate.memory_train import zero_model_state_bytes
from tunedeck.backend.spec import JobSpec, catalog, set_paths

MODELS = ["meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-70B", "Qwen/Qwen2.5-0.5B", "mistralai/Mixtral-8x7B-v0.1"]
LAYOUTS = [(1, 1), (8, 1), (8, 4), (4, 2)]  # (GPUs per node, nodes)


def full_job(model: str, kind: str, per_node: int, nodes: int, offload_opt="none", offload_params="none") -> JobSpec:
    return set_paths(
        JobSpec(),
        {
            "model.name_or_path": model,
            "method": "full",
            "strategy.kind": kind,
            "strategy.offload_optimizer": offload_opt,
            "strategy.offload_params": offload_params,
            "launch.num_processes": per_node * nodes,
            "launch.num_machines": nodes,
        },
    )


def model_state_bytes(spec: JobSpec) -> float:
    b = estimate(spec).breakdown
    return (b["weights"] + b["gradients"] + b["optimizer"]) * GIB


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("per_node,nodes", LAYOUTS)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed_estimator(model, per_node, nodes, offload):
    params = catalog.lookup(model).num_parameters
    _, ds_gpu = estimate_zero2_model_states_mem_needs(
        total_params=params, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=offload
    )
    spec = full_job(model, "zero2", per_node, nodes, offload_opt="cpu" if offload else "none")
    assert model_state_bytes(spec) == pytest.approx(ds_gpu, rel=0.01)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("per_node,nodes", LAYOUTS)
@pytest.mark.parametrize("offload_opt,offload_params", [("none", "none"), ("cpu", "none"), ("cpu", "cpu")])
def test_zero3_matches_deepspeed_estimator(model, per_node, nodes, offload_opt, offload_params):
    arch = catalog.lookup(model)
    _, ds_gpu, largest_layer_memory = estimate_zero3_model_states_mem_needs(
        total_params=arch.num_parameters,
        largest_layer_params=arch.largest_layer_params,
        num_gpus_per_node=per_node,
        num_nodes=nodes,
        cpu_offload=offload_opt != "none",
        cpu_offload_params=offload_params != "none",
    )
    spec = full_job(model, "zero3", per_node, nodes, offload_opt, offload_params)
    assert model_state_bytes(spec) == pytest.approx(ds_gpu - largest_layer_memory, rel=0.01)
    # The estimator's live parameters are its largest layer; with nothing kept for reuse the estimate agrees.
    no_reuse = set_paths(spec, {"strategy.stage3_max_reuse_distance": 0})
    assert estimate(no_reuse).breakdown["gathered"] * GIB == pytest.approx(largest_layer_memory, rel=0.01)


def test_zero3_keeps_the_parameters_it_reuses_within_the_reuse_distance():
    """DeepSpeed's runtime releases no parameter used again within stage3_max_reuse_distance elements (1e9 by
    default): where the forward turns into the backward, the last layers and lm_head stay gathered (16-bit: 2 bytes
    each), more than the estimator's largest layer."""
    spec = full_job("meta-llama/Llama-2-7b-hf", "zero3", 8, 1)
    gathered = estimate(spec).breakdown["gathered"] * GIB
    assert gathered == pytest.approx(10**9 * 2)
    fewer = set_paths(spec, {"strategy.stage3_max_reuse_distance": 200_000_000})
    assert estimate(fewer).breakdown["gathered"] * GIB < gathered
    tiny = full_job("Qwen/Qwen2.5-0.5B", "zero3", 8, 1)  # the whole model is less than the distance
    assert estimate(tiny).breakdown["gathered"] * GIB == pytest.approx(
        catalog.lookup("Qwen/Qwen2.5-0.5B").num_parameters * 2
    )


def test_offloaded_states_move_to_host_memory():
    on_gpu = estimate(full_job("meta-llama/Llama-2-7b-hf", "zero3", 8, 1))
    offloaded = estimate(full_job("meta-llama/Llama-2-7b-hf", "zero3", 8, 1, "cpu", "cpu"))
    moved = (on_gpu.breakdown["weights"] + on_gpu.breakdown["gradients"] + on_gpu.breakdown["optimizer"]) * 8
    assert offloaded.cpu_gb == pytest.approx(moved, rel=0.01)  # per machine: 8 ranks' partitions
    nvme = estimate(full_job("meta-llama/Llama-2-7b-hf", "zero3", 8, 1, "nvme", "nvme"))
    assert nvme.nvme_gb == pytest.approx(moved, rel=0.01) and nvme.cpu_gb < 3


# Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models", Figure 1: a 7.5B-parameter model on 64 GPUs with mixed-precision Adam (K = 12).
ZERO_PAPER_FIGURE_1 = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}  # GB per GPU: baseline, P_os, P_os+g, P_os+g+p


@pytest.mark.parametrize("stage,published_gb", sorted(ZERO_PAPER_FIGURE_1.items()))
def test_reproduces_the_zero_paper_table(stage, published_gb):
    states = zero_model_state_bytes(7_500_000_000, stage, 64, implementation="paper")
    assert round(sum(states.values()) / 1e9, 1) == published_gb


def test_deepspeed_accounting_adds_the_fp32_gradient_copy():
    paper = sum(zero_model_state_bytes(10**9, 2, 8, implementation="paper").values())
    deepspeed = sum(zero_model_state_bytes(10**9, 2, 8).values())
    assert deepspeed - paper == pytest.approx(4 * 10**9 / 8)
