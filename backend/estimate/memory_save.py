"""What saving a checkpoint or the final model adds to the memory of training, per strategy.

A save gathers weights the step never holds whole, so a job that trains fine can fail at its first save
(hiyouga/LlamaFactory#7532). The figures are what the save adds on top of training: on one GPU (the largest
piece gathered at once) and in host RAM on the worst machine (the consolidated copy). Each fact is read from
how train_sft.py saves with the installed libraries (transformers 5 Trainer.save_model and _save_checkpoint,
accelerate's get_state_dict and save_fsdp_model/optimizer, DeepSpeed's _zero3_consolidated_16bit_state_dict):

  DDP       rank 0's save_pretrained writes safetensors from host memory: a GPU model is copied there a
            file at a time (transformers' max_shard_size, 50 GB); under LoRA the adapter alone.
  ZeRO-1/2  accelerate's get_state_dict clones the whole model's state dict to the CPU in every process
            (deepspeed clone_tensors_for_torch_save), the frozen base too under LoRA; PEFT then keeps the adapter.
  ZeRO-3    with stage3_gather_16bit_weights_on_model_save, the 16-bit model is gathered module by module onto
            rank 0's host; under LoRA the adapter alone (exclude_frozen_parameters). Without it: shards only.
  FSDP      the final save is always FULL_STATE_DICT (train_sft.py): the whole model, as stored in training
            (fp32 when accelerate upcasts it; the frozen base too under LoRA), onto rank 0's host. Checkpoints
            with FULL_STATE_DICT gather the model, then the optimizer states, each in turn; SHARDED ones write
            each rank's shard. On the GPU, FSDP 1 gathers a unit at a time, FSDP 2 a parameter.

tests/estimate/test_save_peak.py measures the FSDP case on two CPU ranks (docs/estimates.md, "The save peak").
"""

from __future__ import annotations

from dataclasses import dataclass

from tunedeck.backend.estimate.memory_job import (
    GIB,
    Job,
    frozen_base_params,
    quant_stats_bytes,
)
from tunedeck.backend.estimate.memory_train import _optimizer_state_bytes

SHARD_BYTES = 50 * 10**9  # transformers 5 save_pretrained: max_shard_size="50GB", one file in memory at a time


@dataclass(frozen=True)
class SavePeak:
    """What a save adds to training, in GB (GiB): per GPU, and host RAM on the machine of rank 0."""

    gpu_gb: float
    final_host_gb: float  # the final save (train_sft.py's trainer.save_model)
    checkpoint_host_gb: float  # each checkpoint (Trainer._save_checkpoint)
    how: str  # in words, for the report

    @property
    def host_gb(self) -> float:
        """The larger of the two saves."""
        return max(self.final_host_gb, self.checkpoint_host_gb)

    def to_dict(self) -> dict:
        return {
            "adds_gpu_gb": round(self.gpu_gb, 3),
            "adds_host_gb": round(self.host_gb, 3),
            "final_adds_host_gb": round(self.final_host_gb, 3),
            "checkpoint_adds_host_gb": round(self.checkpoint_host_gb, 3),
            "how": self.how,
        }


def save_peak(job: Job) -> SavePeak:
    """The save's addition for the job's strategy (see the module's table)."""
    kind = job.layout.strategy
    if job.layout.is_fsdp:
        return _fsdp(job)
    if kind.zero_stage == 3:
        return _zero3(job)
    if kind.is_deepspeed:
        return _zero12(job)
    return _ddp(job)


def model_state_bytes(job: Job, trained_bytes: float, frozen_too: bool = True) -> float:
    """Bytes of the model's state dict: the trained weights at `trained_bytes` each, plus the frozen base as
    loaded (quantized with its statistics) under LoRA and QLoRA when `frozen_too`."""
    if job.method == "full":
        return job.arch.num_parameters * trained_bytes
    adapter = job.trainable_params * trained_bytes
    return adapter + (frozen_base_params(job) + quant_stats_bytes(job) if frozen_too else 0.0)


def _fsdp(job: Job) -> SavePeak:
    full = job.method == "full"
    stored = 4 if full and job.precision in ("bf16", "fp16") and not job.software.pure_bf16 else job.weight_bytes
    trained = stored if full else job.software.adapter_bytes
    model = model_state_bytes(job, trained)
    optimizer = job.trainable_params * _optimizer_state_bytes(job.optim, trained)
    full_checkpoints = job.state_dict_type == "FULL_STATE_DICT"
    checkpoint = max(model, optimizer) if full_checkpoints else 0.0
    arch = job.arch
    if job.layout.fsdp_version == 1:
        gpu = job.root_unit_bytes  # the largest unit, gathered whole (FullStateDictConfig offloads unit by unit)
    else:
        gpu = max(arch.embedding_params, arch.head_params) * (stored if full else job.weight_bytes)
    what = "the model" if full else "the model with its frozen base"
    how = f"the final save gathers {what} on rank 0's host (FULL_STATE_DICT, {_gb(model)})"
    how += (
        f"; each checkpoint gathers it, then the optimizer states ({_gb(optimizer)}), there too"
        if full_checkpoints
        else "; checkpoints write each rank's shard (SHARDED_STATE_DICT)"
    )
    if job.use_cpu:  # the gather runs in host memory: gloo's flat buffer of the parameter gathered last, beside the
        model, checkpoint = model + gpu, checkpoint and checkpoint + gpu  # copy (tests/estimate/test_save_peak.py)
    return SavePeak(_gpu(job, gpu), model / GIB, checkpoint / GIB, how)


def _zero3(job: Job) -> SavePeak:
    if not job.gather_16bit:
        how = "each rank writes its shards (stage3_gather_16bit_weights_on_model_save is off): nothing gathered"
        return SavePeak(0.0, 0.0, 0.0, how)
    model = model_state_bytes(job, job.compute_bytes, frozen_too=False)  # PEFT: exclude_frozen_parameters
    # GatheredParameters gathers every module's own parameters in turn, frozen ones too (they are skipped after)
    gpu = job.arch.largest_layer_params * (job.compute_bytes if job.method == "full" else job.weight_bytes)
    what = "the 16-bit model" if job.method == "full" else "the adapter"
    how = f"each save gathers {what} on rank 0's host ({_gb(model)}), a module at a time"
    return SavePeak(_gpu(job, gpu), model / GIB, model / GIB, how)


def _zero12(job: Job) -> SavePeak:
    each = model_state_bytes(job, job.compute_bytes)
    host = each * job.per_machine
    what = "the whole model" if job.method == "full" else "the whole model, frozen base included,"
    how = (
        f"each save copies {what} to host RAM in every process ({_gb(each)} each, {_gb(host)} a machine: "
        "accelerate's get_state_dict)"
    )
    return SavePeak(0.0, host / GIB, host / GIB, how)


def _ddp(job: Job) -> SavePeak:
    if job.method != "full":
        adapter = job.trainable_params * job.software.adapter_bytes
        host = 0.0 if job.use_cpu else adapter
        return SavePeak(0.0, host / GIB, host / GIB, f"rank 0 writes the adapter alone ({_gb(adapter)})")
    if job.use_cpu:  # the weights are in host memory already: safetensors writes them from there
        return SavePeak(0.0, 0.0, 0.0, "rank 0 writes the model from host memory: nothing copied")
    model = model_state_bytes(job, job.weight_bytes)
    host = min(model, SHARD_BYTES)
    how = f"rank 0 copies the model to host RAM a file at a time to write it ({_gb(host)})"
    return SavePeak(0.0, host / GIB, host / GIB, how)


def _gpu(job: Job, nbytes: float) -> float:
    return 0.0 if job.use_cpu else nbytes / GIB  # a CPU run gathers into host memory: counted there (FSDP)


def _gb(nbytes: float) -> str:
    gb = nbytes / GIB
    return f"{gb:.1f} GB" if gb >= 0.1 else f"{gb * 1024:.0f} MB"
