"""The sanity gate: what the job asked for against what the run got, before its first step.

Several launches exit 0 while running something else than asked (measured on CPU, see
the project's notes on CPU distributed runs): `accelerate launch --cpu` and
distributed_type MULTI_CPU start ONE process, torchrun without use_cpu starts independent
ones, FSDP on CPU silently becomes DDP. So every run compares what it got with its job
right after setup, and stops every rank on a difference. The expectation comes from
job.yaml (the spec) and, for trainable parameters, from PEFT itself on a meta-device copy
of the model: no tunedeck code is needed on the cluster.
"""

from __future__ import annotations

import math
import os

from .job import JobError
from .layout import Layout
from .models import peft_config
from .ranks import _world_size, gather_from_ranks, node_name
from .restore import restore_problems
from .vocabulary import STRATEGIES


class GateError(JobError):
    """The run did not get what its job asked for."""


ENGINE_NAMES = {"deepspeed": "DeepSpeed", "fsdp": "FSDP", "ddp": "DDP", "none": "no data-parallel wrapper"}


def expected_run(job: dict) -> dict:
    """What the job asks for, in the terms of the start record: the job's Layout (layout.py), which the spec's
    validation, the bundle's files and the estimate read too."""
    kind = (job.get("strategy") or {}).get("kind", "ddp")
    if kind not in STRATEGIES:
        raise JobError(f"strategy.kind: {kind!r} is not one of {', '.join(STRATEGIES)}")
    layout = Layout.of(job)
    return {
        "world_size": layout.world_size,
        "machines": layout.machines,
        "engine": layout.wrapper,
        "zero_stage": layout.zero_stage,
        "sequence_parallel": layout.sequence_parallel,
        "fsdp_version": layout.fsdp_version,
        "bits": (job.get("quantization") or {}).get("bits"),
        "trainable_params": None,  # train() adds expected_trainable(job)
        "lora_scaling": lora_scaling(job),
        "neftune_noise_alpha": (job.get("training") or {}).get("neftune_noise_alpha")
        if job.get("objective", "sft") == "sft"
        else None,
    }


def lora_scaling(job: dict) -> float | None:
    """What PEFT multiplies the adapters' update by: lora_alpha / r, or / sqrt(r) with rsLoRA; None without adapters."""
    if job.get("method", "lora") not in ("lora", "qlora"):
        return None
    lora = job.get("lora") or {}
    r, alpha = int(lora.get("r", 8)), float(lora.get("lora_alpha", 8))
    return alpha / math.sqrt(r) if lora.get("use_rslora") else alpha / r


def expected_trainable(job: dict) -> int | None:
    """PEFT's trainable-parameter count for the job's adapter (all parameters for full fine-tuning).

    Built on the meta device (no memory, no weights read). Call it before SFTConfig exists: under ZeRO-3
    transformers would build the copy inside deepspeed.zero.Init. None when the config cannot be read
    (load_model then says why).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_cfg = job.get("model") or {}
    remote = bool(model_cfg.get("trust_remote_code", False))
    try:
        config = AutoConfig.from_pretrained(
            model_cfg["name_or_path"], trust_remote_code=remote, revision=model_cfg.get("revision") or None
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
    except Exception as exc:  # noqa: BLE001 - a missing or odd model is load_model's to report
        print(f"sanity gate: trainable parameters not checked ({type(exc).__name__}: {exc})", flush=True)
        return None
    adapter = peft_config(job)
    if adapter is None:
        return sum(p.numel() for p in model.parameters())
    from peft import get_peft_model

    with torch.device("meta"):  # the adapters too: a 70B model's take seconds here, a minute on the CPU
        return get_peft_model(model, adapter).get_nb_trainable_parameters()[0]


def engine_of(facts: dict) -> str:
    """deepspeed | fsdp | ddp | none: from the wrapped model, or before wrapping from accelerate's distributed type."""
    if "model_class" not in facts:  # FSDP or DDP is only decided when the model is wrapped
        return {"DEEPSPEED": "deepspeed", "NO": "none"}.get(facts["distributed_type"], "ddp")
    if facts.get("zero_stage") is not None:
        return "deepspeed"
    if facts.get("fsdp_version"):
        return "fsdp"
    return "ddp" if facts.get("model_class") == "DistributedDataParallel" else "none"


def gate_problems(expected: dict, facts: dict) -> list[str]:
    """Each difference between the job and what the run got, worded with its likely cause.

    facts: a start record; or, earlier, only world_size (from the launcher's environment), nodes
    and distributed_type (once the process group exists): then only those are compared.
    """
    problems = _process_problems(expected, facts)
    if "distributed_type" in facts:
        problems += _engine_problems(expected, facts)
    if "model_class" in facts:
        problems += _model_problems(expected, facts) + restore_problems(facts)
    return problems


def _process_problems(expected: dict, facts: dict) -> list[str]:
    asked_ranks, got_ranks = expected["world_size"], facts["world_size"]
    asked_machines, nodes = expected["machines"], facts.get("nodes")
    got_machines = len(set(nodes)) if nodes else asked_machines  # the launcher's environment names no nodes
    if (asked_ranks, asked_machines) == (got_ranks, got_machines):
        return []
    got, why = str(got_ranks), ""
    if got_machines != asked_machines:
        got += f" on {_count(got_machines, 'machine')} ({', '.join(sorted(set(nodes or [])))})"
        why = ": start launch.sh once on every machine, each with its own MACHINE_RANK"
    if got_ranks == 1 and asked_ranks > 1:
        why = (
            ": the processes did not join one run (`accelerate launch --cpu` and distributed_type MULTI_CPU start "
            "a single process; torchrun on CPU without use_cpu starts independent ones)"
        )
    return [
        f"asked {_count(asked_ranks, 'process', 'processes')} on {_count(asked_machines, 'machine')}, got {got}{why}"
    ]


def _engine_problems(expected: dict, facts: dict) -> list[str]:
    asked, got = expected["engine"], engine_of(facts)
    if asked == "fsdp" and got == "ddp" and "model_class" not in facts:
        return []  # not wrapped yet: FSDP ranks look like DDP ranks until then
    if asked != got:
        why = ""
        if got == "none" and asked == "deepspeed":
            why = (
                " (DeepSpeed starts only through `accelerate launch --config_file accelerate_config.yaml`, "
                "which exports its config)"
            )
        elif got == "none" and expected["world_size"] > 1:
            why = " (the ranks train alone, sharing no gradient: on CPU, training_args.yaml needs use_cpu: true)"
        elif asked == "fsdp":
            why = (
                " (accelerate falls back to DDP where it does not run FSDP: FSDP1 needs GPUs, and train_sft.py runs "
                "FSDP2 on CPU ranks only when the launcher exports an FSDP2 config)"
            )
        return [f"asked {_engine(expected)}, got {_engine(facts, got)} ({facts['distributed_type']}){why}"]
    if "model_class" not in facts:
        return []
    if asked == "deepspeed" and expected["zero_stage"] != facts["zero_stage"]:
        return [f"asked DeepSpeed ZeRO-{expected['zero_stage']}, got ZeRO-{facts['zero_stage']}"]
    asked_sp, got_sp = expected.get("sequence_parallel", 1), facts.get("sequence_parallel", 1)
    if asked == "deepspeed" and asked_sp != got_sp:
        return [
            f"asked {asked_sp} GPUs per sequence (strategy.sequence_parallel), got {got_sp} (accelerate takes it "
            "from accelerate_config.yaml's parallelism_config: launch with --config_file accelerate_config.yaml)"
        ]
    if asked == "fsdp" and expected["fsdp_version"] != facts["fsdp_version"]:
        return [f"asked FSDP{expected['fsdp_version']}, got FSDP{facts['fsdp_version']}"]
    return []


def _model_problems(expected: dict, facts: dict) -> list[str]:
    problems = []
    bits, quantized = expected["bits"], facts.get("quantized_modules") or {}
    wanted_class = {4: "Linear4bit", 8: "Linear8bitLt"}.get(bits)
    if wanted_class and not quantized.get(wanted_class):
        problems.append(f"asked a {bits}-bit base (quantization.bits={bits}), got no {wanted_class} module")
    if expected["trainable_params"] is not None and expected["trainable_params"] != facts["trainable_params"]:
        asked, got = expected["trainable_params"], facts["trainable_params"]
        problems.append(f"asked {asked:,} trainable parameters (PEFT's count for the job), got {got:,}")
    asked_scale, got_scale = expected.get("lora_scaling"), facts.get("lora_scaling")
    if asked_scale is not None and got_scale is not None and not math.isclose(asked_scale, got_scale, rel_tol=1e-6):
        problems.append(
            f"asked adapters scaled by {asked_scale:.4g} (lora.lora_alpha, lora.r, lora.use_rslora), "
            f"got {got_scale:.4g}"
        )
    if "neftune_noise_alpha" in facts and facts["neftune_noise_alpha"] != expected.get("neftune_noise_alpha"):
        problems.append(f"asked NEFTune noise {expected['neftune_noise_alpha']}, got {facts['neftune_noise_alpha']}")
    return problems


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _engine(facts: dict, engine: str | None = None) -> str:
    engine = engine or facts["engine"]
    if engine == "deepspeed":
        return f"DeepSpeed ZeRO-{facts['zero_stage']}"
    if engine == "fsdp":
        return f"FSDP{facts['fsdp_version']}"
    return ENGINE_NAMES[engine]


def shared_gate_problems(expected: dict, facts: dict) -> list[str]:
    """Rank 0's verdict, shared with every rank (a collective), so that all ranks stop together."""
    import torch.distributed as dist

    problems = gate_problems(expected, facts)
    if dist.is_available() and dist.is_initialized():
        shared = [problems]
        dist.broadcast_object_list(shared, src=0)
        problems = shared[0]
    return problems


def gate_error(problems: list[str]) -> GateError:
    return GateError("sanity gate: " + "; ".join(problems))


def check_processes(expected: dict, distributed_type: str | None = None) -> None:
    """The early part of the gate, before minutes of model loading: processes, machines, engine.

    Without distributed_type (accelerate's, once SFTConfig set up the process group) it reads the
    launcher's environment: a process started alone stops here in a second, instead of failing to
    build a gloo group in SFTConfig.
    """
    if distributed_type is None:
        # The variables accelerate itself reads for the world size (torchrun and accelerate set WORLD_SIZE; MPI the others).
        sizes = [
            os.environ.get(name) for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
        ]
        problems = gate_problems(expected, {"world_size": int(next((n for n in sizes if n), 1))})
    else:
        facts = {
            "world_size": _world_size(),
            "nodes": gather_from_ranks(node_name()),
            "distributed_type": distributed_type,
        }
        problems = shared_gate_problems(expected, facts)
    if problems:
        raise gate_error(problems)
