"""Load phase: what one GPU, and the host RAM of one machine, hold while the model loads.

Before training starts, every rank runs `from_pretrained`, PEFT adds the adapters, and only
then does `accelerator.prepare` hand the model to FSDP or DeepSpeed. What sits on the GPU and
in host RAM until then depends on the path transformers 5.24 / accelerate 1.15 / DeepSpeed
take, read in their code (the function is named at each branch below) and checked on this
machine by tests/estimate/test_load_paths.py (two real ranks):

  4-bit/8-bit (bitsandbytes)  quantized on each rank's own GPU, whole, whatever the strategy:
                              the quantizer maps a model without device_map to the current
                              GPU (Bnb4BitHfQuantizer.update_device_map) and transformers
                              skips zero.Init for quantized models (get_init_context).
                              ZeRO-3 and FSDP shard it only afterwards; accelerate does not
                              move 4-bit models to meta first (fsdp2_prepare_model:
                              model_has_params4bit, "will still cause the VRAM spike").
  ZeRO-3, 16-bit              zero.Init partitions each weight as it is built; rank 0 alone
                              reads the checkpoint (_load_pretrained_model: map_location
                              "cpu" on rank 0, "meta" elsewhere) and each module is gathered
                              in turn to copy it in (_load_state_dict_into_zero3_model).
  FSDP, 16-bit                every rank materialises the whole model in host RAM, also with
                              fsdp_cpu_ram_efficient_loading (transformers 5.24 only skips
                              re-initialising on other ranks); fully_shard then moves one
                              unit at a time to the GPU and keeps its shard.
  DDP, ZeRO-1/2, 16-bit       every rank materialises the whole model in host RAM, then moves
                              all of it to its GPU (Trainer._move_model_to_device, or
                              DeepSpeed's engine).
Host RAM counts a private copy per rank: transformers converts the checkpoint into
model.dtype (core_model_loading._materialize_copy); measured here, 2 ranks loading a 321 MiB
checkpoint as another dtype took 408 MiB of private memory each. Ranks share the
memory-mapped file instead when the checkpoint is stored in model.dtype already (87 MiB).
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_job import Job, frozen_base_params, largest_linear_params, quant_stats_bytes

LOAD_TERMS: dict[str, str] = {
    "weights": "Weights as loaded",
    "reference": "Reference model (DPO, KTO, GRPO with KL)",
    "adapter": "LoRA adapter",
    "in_flight": "Tensor in flight",
    "cuda_context": "CUDA context",
}


def load_phase(job: Job) -> tuple[dict[str, float], float, str]:
    """(bytes per GPU per LOAD_TERMS key, host RAM bytes per machine, how it loads in words)."""
    # PEFT creates the adapters (fp32, autocast_adapter_dtype) beside the base before prepare().
    adapter = job.software.adapter_bytes * job.trainable_params if job.method != "full" else 0.0
    if job.bits:
        terms = {
            "weights": frozen_base_params(job) + quant_stats_bytes(job),
            "adapter": adapter,
            # One weight at a time arrives in model.dtype and is quantized on the GPU
            # (convert_and_load_state_dict_in_model loads sequentially for on-the-fly quantization).
            "in_flight": largest_linear_params(job) * job.weight_bytes,
        }
        host = 0.0  # weights stream from the memory-mapped checkpoint straight to the GPU
        how = "every GPU first holds the whole quantized model"
        if job.strategy.shards_parameters:
            how += f", before {job.strategy.label} shards it, whatever the number of GPUs"
    elif job.layout.is_zero3:
        on_gpu = job.offload_params == "none"
        terms = {
            "weights": job.arch.num_parameters * job.weight_bytes / job.world if on_gpu else 0.0,
            "adapter": adapter,
            "in_flight": job.arch.largest_layer_params * job.weight_bytes,
        }
        host = job.arch.num_parameters * job.weight_bytes  # rank 0's state dict
        if job.offload_params == "cpu":  # zero.Init places the partitions in host memory
            host += job.arch.num_parameters * job.weight_bytes / job.world * job.per_machine
        how = "zero.Init shards the weights as they load; rank 0 reads the whole checkpoint into host RAM"
    elif job.layout.is_fsdp:
        element = _fsdp_cpu_bytes(job)
        shard = (job.arch.num_parameters * element + adapter) / job.shards
        on_gpu = job.offload_params == "none"
        unit = max(job.arch.layer_params, job.arch.embedding_params) * element
        terms = {"weights": shard if on_gpu else 0.0, "adapter": 0.0, "in_flight": unit}
        host = job.arch.num_parameters * element * job.per_machine + (0.0 if on_gpu else shard * job.per_machine)
        how = "every rank reads the whole checkpoint into host RAM; FSDP moves one unit at a time to the GPU"
    else:
        # torchtune's builders hold a template layer beside the model's (memory_software: builds_extra_layer).
        template = job.arch.layer_params * job.weight_bytes if job.software.builds_extra_layer else 0.0
        terms = {"weights": job.arch.num_parameters * job.weight_bytes, "adapter": adapter, "in_flight": template}
        host = job.arch.num_parameters * job.weight_bytes * job.per_machine
        how = "every rank reads the whole checkpoint into host RAM, then moves the whole model to its GPU"
    if loads_reference(job):
        # train.py loads the frozen reference right after the model, the same way: zero.Init shards it as it loads
        # (rank 0 reads its checkpoint once the model's is freed); otherwise every rank holds a whole copy in host
        # RAM beside the model's, which DDP and ZeRO-1/2 then move to the GPU whole and FSDP as a shard.
        whole = job.arch.num_parameters * job.weight_bytes
        terms["reference"] = terms["weights"] if job.layout.shards_parameters else whole
        host += 0.0 if job.layout.is_zero3 else whole * job.per_machine
    terms["cuda_context"] = job.device_overhead
    return terms, host, how


def loads_reference(job: Job) -> bool:
    """A full DPO or KTO loads a reference copy: unless its scores are computed before training, where FSDP alone
    still needs one (train.py: the model is sharded only when training starts)."""
    return job.full_reference and (not job.precomputed_reference or job.layout.is_fsdp)


def _fsdp_cpu_bytes(job: Job) -> int:
    """Bytes per parameter on the CPU when FSDP takes the model: accelerate upcasts trainable
    16-bit parameters to fp32 before sharding under mixed precision (fsdp2_prepare_model)."""
    if job.method == "full" and job.precision in ("bf16", "fp16") and not job.software.pure_bf16:
        return 4
    return job.weight_bytes
