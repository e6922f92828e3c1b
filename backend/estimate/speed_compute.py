"""One GPU's compute time for a micro batch and for the optimizer step, by the shape of the work.

A micro batch of T tokens through a model of L layers, hidden size h, on a GPU of peak P and memory
bandwidth B (backend/estimate/speed_generation.py's HBM table), passes = 2 (forward, backward), one more with activation
checkpointing (the recomputed forward) and one more for each forward without gradients the objective adds (DPO's
and KTO's reference: backend/spec/flops.py's extra_forwards):

  matmuls     max(T x FLOPs per token / (P x efficiency[method]), passes x the weights' bytes / B): at a
              few hundred tokens a matmul reads its weight faster than it multiplies, below that the read is
              the bound (the roofline: an A100's ridge is at about 150 FLOPs per byte)
  elementwise T x L x h x ELEMENTWISE_BYTES x forwards / 3 / B, forwards = 3 for forward and backward, one more
              for each further forward (so in step with the FLOPs): norms, rotary, activations, residual adds and
              casts read and write h-wide activations; memory-bound, so a GPU with a high peak per byte of
              bandwidth (H100, L40S) spends a larger share of a step here
  launches    L x passes x (LAYER_LAUNCH_S + ADAPTER_LAUNCH_S x the layer's LoRA-wrapped modules): each layer's
              kernels are launched one by one from Python, ahead of
              the GPU while its kernels are long; with a short micro batch the GPU waits for them, so the micro
              batch takes the longer of the two (LitGPT's 1.3B model at one 100-token row takes 70% of its 7B's
              time, tests/data/measured_throughput.yaml)
  dequantize  QLoRA: every 4-bit weight is expanded to the compute dtype before its matmul, in every pass
              (bitsandbytes' dequantize kernel): passes x the 4-bit weights x DEQUANT_BYTES / B

and once per optimizer step the update, memory-bound: OPTIMIZER_PASSES tensor reads and writes of each trainable
parameter this GPU updates, in the weights' dtype (fp32 for adapters and DeepSpeed's master weights). A full
fine-tune of 3B at a short batch spends half its step there with torch's foreach AdamW.

The constants with no datasheet (the efficiencies, ELEMENTWISE_BYTES, the launch times, DEQUANT_BYTES) are FITTED
to two thirds of the published runs in tests/data/measured_throughput.yaml: `python bench/fit_speed.py` refits
them and prints the error on those and on the third held out of the fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunedeck.backend.estimate.memory_job import Job
from tunedeck.backend.estimate.speed_generation import hbm_bytes_per_s
from tunedeck.backend.spec import flops

# Tensor passes (a read or a write of one parameter-sized tensor) of an optimizer step, by training.optim, each
# with gradient clipping's 3 (clip_grad_norm_: the norm reads the gradients, the scaling reads and writes them).
# Fused AdamW reads weight, gradient and both moments and writes weight and moments: 7. torch's foreach AdamW
# (torch/optim/adamw.py, _multi_tensor_adamw) runs one kernel per operation: lerp of the first moment (3), the
# second moment's mul and addcmul (5), weight decay (2), sqrt, divide and add eps on a temporary (6), addcdiv
# into the weight (4): 20. 8-bit AdamW keeps the moments in 1 byte: counted as a fused AdamW of 5 weight-sized
# passes. Adafactor's factored moments and SGD: fewer passes.
OPTIMIZER_PASSES = {
    "adamw_torch": 23, "adamw_torch_fused": 10, "paged_adamw_32bit": 10, "adamw_bnb_8bit": 8, "paged_adamw_8bit": 8,
    "adafactor": 12, "sgd": 6,
}  # fmt: skip


@dataclass(frozen=True)
class SpeedConstants:
    """The fitted constants of the compute time (bench/fit_speed.py)."""

    efficiency_full: float  # share of the peak a large matmul reaches, per method
    efficiency_lora: float
    efficiency_qlora: float
    elementwise_bytes: float  # bytes moved per token, layer and hidden unit by the elementwise ops, forward+backward
    layer_launch_s: float  # seconds of kernel launches per layer and pass
    adapter_launch_s: float  # more for each LoRA-wrapped module of a layer (dropout, A, B, scale, add)
    dequant_bytes: float  # bytes moved per 4-bit weight and pass to dequantize it

    def efficiency(self, method: str) -> float:
        return {"full": self.efficiency_full, "lora": self.efficiency_lora, "qlora": self.efficiency_qlora}[method]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# `python bench/fit_speed.py` prints these: fitted on 28 of the 42 published runs (6 publishers), the other 14 held
# out; mean absolute error 12.3% on the fit rows (largest 57%), 11.8% on the held-out rows (largest 34%). The
# efficiencies are bounded at 0.8 (what cuBLAS reaches on large bf16 matmuls); elementwise_bytes is an effective
# constant: besides the elementwise ops it carries what else grows with tokens x width on a GPU with little
# bandwidth per FLOP (H100, L40S); the launch times are those of eager PyTorch as LitGPT, PEFT and torchtune run it.
FITTED = SpeedConstants(
    efficiency_full=0.7824,
    efficiency_lora=0.8,
    efficiency_qlora=0.7647,
    elementwise_bytes=727,
    layer_launch_s=0.001287,
    adapter_launch_s=0.0004307,
    dequant_bytes=25.98,
)


def passes(job: Job) -> int:
    """Passes over the weights of a micro batch: forward, backward, the recomputed forward, the objective's others."""
    extra = flops.extra_forwards(job.objective, job.precomputed_reference, job.kl_reference)
    return 2 + job.checkpointing + extra


def micro_batch_seconds(
    job: Job, gpu: str | None, peak_flops: float, tokens: float, flops_per_token: float, constants: SpeedConstants
) -> float:
    """One GPU's seconds for a micro batch of `tokens` processed tokens (hardware FLOPs per token given)."""
    arch = job.arch
    n = passes(job)
    matmul = tokens * flops_per_token / (peak_flops * constants.efficiency(job.method))
    hbm = hbm_bytes_per_s(gpu)
    adapters = 0 if job.method == "full" else len(arch.adapted_weights(job.lora_targets))
    launches = arch.num_hidden_layers * n * (constants.layer_launch_s + adapters * constants.adapter_launch_s)
    if hbm is None:  # no bandwidth known: the FLOPs alone
        return max(matmul, launches)
    weights = flops.arch_matmul_params(arch)[0] * job.compute_bytes
    matmul = max(matmul, n * weights / hbm)
    forwards = n + 1  # forward and backward count 3 forwards' work, as in backend/spec/flops.py
    elementwise = tokens * arch.num_hidden_layers * arch.hidden_size * constants.elementwise_bytes * forwards / 3 / hbm
    dequantize = n * arch.linear_params * constants.dequant_bytes / hbm if job.method == "qlora" else 0.0
    return max(matmul + elementwise + dequantize, launches)


def optimizer_seconds(job: Job, gpu: str | None, trainable: int) -> float:
    """One GPU's seconds for the AdamW update of its share of the trainable parameters (0 when it runs on the CPU:
    backend/estimate/speed.py's offload term)."""
    hbm = hbm_bytes_per_s(gpu)
    if hbm is None or job.offload_optimizer != "none":
        return 0.0
    state_bytes = 4 if job.method != "full" or job.layout.is_deepspeed or job.weight_bytes == 4 else job.weight_bytes
    sharded = job.layout.shards_optimizer
    passes = OPTIMIZER_PASSES.get(job.optim, OPTIMIZER_PASSES["adamw_torch"])
    return trainable / (job.shards if sharded else 1) * passes * state_bytes / hbm
