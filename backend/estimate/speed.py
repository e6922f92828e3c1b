"""Predicted speed of a job: step time, tokens/s per GPU, time to finish and cost, per strategy.

A step is compute plus the communication compute does not hide, plus offload traffic:

  compute   by the shape of the work (backend/estimate/speed_compute.py): a micro batch's matmuls (hardware
            FLOPs from backend/spec/flops.py over the peak x a fitted efficiency, or the weights' reads when
            that is longer), its memory-bound elementwise ops, its kernel launches and QLoRA's
            dequantization; and the optimizer's update once a step. The constants are fitted on two
            thirds of the published runs in tests/data/measured_throughput.yaml and judged on the
            third the fit never saw (bench/fit_speed.py).
  data      the tokens a micro batch computes and those it trains on (backend/estimate/speed_data.py): rows
            padded to the longest of their batch, or packed; measured by the dataset preview, else
            every row assumed max_seq_length long (and said so). tokens_per_s_per_gpu counts useful
            tokens (what train.py logs), processed_tokens_per_s_per_gpu the padding too.
  comms     per optimizer step, by engine: DDP all-reduces the trainable gradients once
            (the Trainer skips the sync on accumulation micro-steps, `no_sync`); ZeRO-1
            reduce-scatters them once and all-gathers the updated weights; ZeRO-2
            reduce-scatters on every micro-step (DeepSpeed has no no_sync for stage 2/3);
            ZeRO-3 and FSDP FULL_SHARD all-gather the weights for forward and again for
            backward on every micro-step (ZeRO paper, Rajbhandari et al. 2020, section 7:
            1.5x DDP's volume; https://arxiv.org/abs/1910.02054); SHARD_GRAD_OP gathers once
            per micro-step; HYBRID_SHARD shards inside a machine and all-reduces gradient
            shards across machines. A ring moves (n-1)/n of a tensor per GPU for a
            reduce-scatter or all-gather and twice that for an all-reduce (NCCL's bus
            bandwidth, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
            Gradient traffic hides behind the backward pass (2/3 of a micro-step's compute),
            prefetched weight gathers behind the whole micro-step; what is left is exposed.
  offload   optimizer states on the CPU: gradients down and weights up over PCIe, and the
            Adam step on the CPU (memory-bound); NVMe: the states through the disk.
  generation  GRPO: writing the answers before the step, decode step by decode step, bound by the
            GPU's memory bandwidth (backend/estimate/speed_generation.py); the prompts' prefill is compute.

  sequence_parallel  Ulysses' all-to-alls with N GPUs per sequence (backend/estimate/speed_sequence.py); the
            compute is then the GPU's 1/N of each sequence.

Around the steps (not one constant): start-up, reading the weights, evaluation passes
(forward only) and checkpoint saves (adapter, or weights and optimizer states for full
fine-tuning). The steps: backend/estimate/speed_schedule.py (packed rows make fewer sequences, so fewer steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from tunedeck.backend.estimate.memory_job import Job, frozen_base_params
from tunedeck.backend.estimate.speed_compute import FITTED, SpeedConstants, micro_batch_seconds, optimizer_seconds
from tunedeck.backend.estimate.speed_data import DataShape, full_rows
from tunedeck.backend.estimate.speed_generation import generation_seconds
from tunedeck.backend.estimate.speed_schedule import KNOWN_DATASET_ROWS, Schedule, dataset_rows, schedule_of
from tunedeck.backend.estimate.speed_sequence import all_to_all_seconds, spans_machines
from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.spec import flops

# The schedule lives in speed_schedule.py; callers import it from here, with the prediction.
__all__ = ["KNOWN_DATASET_ROWS", "Hardware", "Schedule", "SpeedEstimate", "dataset_rows", "predict", "schedule_of"]

# ---------------------------------------------------------------- constants, each with its source

# The compute constants (efficiency per method, elementwise bytes, launch time, dequantization) are
# backend/estimate/speed_compute.py's FITTED, refitted by `python bench/fit_speed.py`.
# Near-equal predictions (within this share) keep the guides' order: less memory risk for nothing.
TIE_SHARE = 0.03

NCCL_EFFICIENCY = 0.8  # nccl-tests' bus bandwidth reaches about 80% of the link rate (PERFORMANCE.md above)
# (name, GB/s per direction, scope, source). Inside a machine the figure is per GPU; between
# machines per machine (InfiniBand: one NIC per GPU, as in NVIDIA's DGX/HGX reference designs).
INTERCONNECTS = {
    "nvlink": (300.0, "gpu", "NVLink 3: 600 GB/s bidirectional per A100 (A100 datasheet); H100's 900 GB/s is faster"),
    "pcie": (32.0, "gpu", "PCIe 4.0 x16: 16 GT/s x 16 lanes, about 32 GB/s per direction (PCI-SIG)"),
    "infiniband": (25.0, "nic-per-gpu", "HDR InfiniBand: 200 Gb/s = 25 GB/s per NIC, one NIC per GPU (DGX A100)"),
    "ethernet": (12.5, "machine", "100 Gb Ethernet: 12.5 GB/s per machine, shared by its GPUs"),
}
INTRA_LINKS, INTER_LINKS = ("nvlink", "pcie"), ("infiniband", "ethernet")
PCIE_HOST_GBPS = 25.0  # GPU<->pinned host memory on PCIe 4.0 x16 (80% of 32 GB/s, as NCCL above)
# CPU Adam is memory-bound: it reads fp32 weight, gradient, two moments and writes three back
# (28 bytes) plus the bf16 copy (2): about 30 bytes per parameter, at 100 GB/s of host memory
# bandwidth per machine (half of 8-channel DDR4-3200's 204.8 GB/s theoretical).
CPU_ADAM_BYTES, HOST_MEMORY_GBPS = 30, 100.0
NVME_GBPS = 3.0  # one PCIe 4.0 NVMe drive's sustained rate per machine (drives reach 3-7 GB/s sequential)
# Launch to the first step, before the weights are read: imports (torch, transformers, TRL), the
# process group, tokenizing. Measured: 62 s for the 2-rank CPU demo on a loaded 2-core machine
# (status.json's started_at to the start record); a GPU node with fast cores takes less.
STARTUP_S = 45.0
READ_GBPS = 1.5  # safetensors from a local disk, cold page cache
WRITE_GBPS = 1.0  # checkpoints to a local or network disk


@dataclass(frozen=True)
class Hardware:
    """The GPU (its GPU_TABLE key, or None when unknown), its peak for the job's dtype, the links, the price."""

    gpu: str | None
    intra: str = "nvlink"  # between the GPUs of a machine
    inter: str = "infiniband"  # between machines
    price_per_gpu_hour: float | None = None
    source: str = ""  # where the GPU came from: NVML, --gpu, assumed
    # Between machines, what your runs measured (recipe/network.py's all-reduce bus bandwidth over every rank, GB/s)
    # in place of the link table's rate: `estimate --calibrate` sets it (backend/runs/speed.py's Calibration).
    measured_ring_gbps: float | None = None

    @classmethod
    def named(cls, name: str | None, interconnect: str | None = None, **kwargs) -> Hardware:
        """From a GPU name (NVML's or typed) and one --interconnect value. ValueError naming the fix."""
        row = flops.gpu_row(name) if name else None
        if name and row is None:
            known = ", ".join(r[0] for r in flops.GPU_TABLE)
            raise ValueError(f"unknown GPU {name!r}: use one of {known}")
        intra = "nvlink" if row is None or row[3] else "pcie"
        inter = "infiniband"
        if interconnect is not None:
            if interconnect not in INTERCONNECTS:
                raise ValueError(f"unknown interconnect {interconnect!r}: use one of {', '.join(INTERCONNECTS)}")
            if interconnect in INTRA_LINKS:
                intra = interconnect
            else:
                inter = interconnect
        return cls(gpu=row[0] if row else None, intra=intra, inter=inter, **kwargs)

    def peak(self, dtype: str) -> float | None:
        return _peak(self.gpu, dtype) if self.gpu else None


@lru_cache(maxsize=64)
def _peak(gpu: str, dtype: str) -> float | None:
    return flops.peak_tflops(gpu, dtype)[0]  # the page predicts a dozen options per keystroke


ASSUMED_GPU = "A100-80GB"  # the GPU a prediction assumes when none is named or found (and says so)


def hardware_for(gpu_text, interconnect: str | None = None, price: float | None = None) -> Hardware:
    """The hardware of a GPU box's text ('A100-80GB', an NVML name, or only a size such as '80')."""
    if isinstance(gpu_text, str) and flops.gpu_row(gpu_text) is not None:
        return Hardware.named(gpu_text, interconnect, price_per_gpu_hour=price)
    return Hardware.named(ASSUMED_GPU, interconnect, price_per_gpu_hour=price, source="assumed")


@dataclass(frozen=True)
class SpeedEstimate:
    step_time_s: float
    tokens_per_s_per_gpu: float  # useful tokens (no padding): what train.py measures and users compare
    mfu: float  # the predicted model FLOPs utilisation
    parts: dict[
        str, float
    ]  # seconds per step: compute, optimizer, exposed communication, offload (GRPO: generation; sequence_parallel)
    around_s: dict[str, float]  # seconds outside the steps: startup, load, eval, checkpoints, reference
    steps: int | None
    steps_source: str
    hours: float | None
    cost: float | None
    notes: tuple[str, ...] = field(default=())
    processed_tokens_per_s_per_gpu: float = 0.0  # with the padding the GPU computes too
    data: DataShape | None = None  # how the rows fill a micro batch (measured, or assumed: data.assumed)

    @property
    def data_sentence(self) -> str:
        """The useful share of what is computed and where the lengths come from, in words."""
        if self.data is None:
            return ""
        if self.data.assumed:
            return self.data.note
        share = self.data.useful_share
        padding = f"{1 - share:.0%} of the tokens computed are padding" if share < 0.995 else "no padding"
        return f"{padding}: {self.data.note}"

    @property
    def pace(self) -> float:
        """Seconds per token on one GPU, what options compare by: a step with more GPUs per sequence reads fewer rows.
        To three significant digits: the model errs by a tenth (bench/fit_speed.py), so options a thousandth apart
        (a LoRA optimizer step sharded or not) tie and keep the guides' order."""
        return float(f"{1 / self.tokens_per_s_per_gpu:.3g}")

    def to_dict(self) -> dict:
        return {
            "step_time_s": round(self.step_time_s, 3),
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
            "processed_tokens_per_s_per_gpu": round(self.processed_tokens_per_s_per_gpu, 1),
            "data": None
            if self.data is None
            else {
                "useful_share": round(self.data.useful_share, 3),
                "lengths": self.data.note,
                "assumed": self.data.assumed,
            },
            "predicted_mfu": round(self.mfu, 3),
            "hours": None if self.hours is None else round(self.hours, 3),
            "cost": None if self.cost is None else round(self.cost, 2),
            "steps": self.steps,
            "steps_source": self.steps_source,
            "step_parts_s": {k: round(v, 3) for k, v in self.parts.items()},
            "around_steps_s": {k: round(v, 1) for k, v in self.around_s.items()},
        }


# ---------------------------------------------------------------- the prediction


def compute_dtype(job: Job) -> str:
    if job.precision in ("bf16", "fp16"):
        return job.precision
    return "bf16" if job.weight_bytes == 2 else "tf32"  # PyTorch allows TF32 matmuls under the Trainer's tf32


def predict(
    job: Job, hw: Hardware, schedule: Schedule, correction: float = 1.0, constants: SpeedConstants = FITTED
) -> SpeedEstimate | None:
    """The job's speed on this hardware, or None without a peak to compute from (a CPU job, an unknown GPU).

    correction multiplies the throughput (from the user's own runs, backend/runs/speed.py); constants: the fitted
    compute constants (bench/fit_speed.py passes its trial values)."""
    peak = hw.peak(compute_dtype(job))
    if job.use_cpu or not peak:
        return None
    full = job.method == "full"
    trainable = job.trainable_params  # a property that counts the adapters: once per prediction
    data = _data_shape(job, schedule)
    # The GPU computes the padding too; each token attends over its own row (or its padded row).
    processed = job.tokens * data.processed_for(job.seq_len) / job.seq_len
    attention = int(min(data.attention_tokens, job.seq_len))
    passes = flops.extra_forwards(job.objective, job.precomputed_reference, job.kl_reference)
    model_flops, hardware_flops = flops.arch_flops_per_token(
        job.arch, trainable, attention, full, job.checkpointing, passes
    )
    if job.objective == "grpo":  # the answers' decode steps are timed as generation below; the prefill stays here
        hardware_flops = flops.arch_flops_per_token(
            job.arch, trainable, job.seq_len, full, job.checkpointing, passes - job.completion_len / job.seq_len
        )[1]
    micro = micro_batch_seconds(job, hw.gpu, peak * 1e12, processed, hardware_flops, constants) / correction
    ga, schedule = schedule.grad_accum, schedule.at(job.sequence_parallel)  # an option's own GPUs per sequence
    comms, notes = _exposed_comms(job, hw, micro, ga, trainable)
    offload = _offload(job, trainable)
    optimizer = optimizer_seconds(job, hw.gpu, trainable) / correction
    parts = {"compute": ga * micro, "optimizer": optimizer, "communication": comms, "offload": offload}
    if job.sequence_parallel > 1:
        rate = _bandwidth(hw, job.per_machine, job.machines if spans_machines(job) else 1)[0]
        parts["sequence_parallel"] = all_to_all_seconds(job, ga, rate)
    if job.objective == "grpo":
        # Saturated efficiency: a decode step's small matmuls are what the bandwidth bound stands for.
        decode_flops_per_s = peak * 1e12 * constants.efficiency(job.method) * correction
        parts["generation"], more = generation_seconds(
            job, hw.gpu, decode_flops_per_s, _gather_rate(job, hw), PCIE_HOST_GBPS * 1e9
        )
        notes += more
    step = sum(parts.values())
    processed_per_s = ga * processed / step
    around = _around_steps(job, schedule, peak * 1e12 * constants.efficiency(job.method) * correction, trainable)
    hours = cost = None
    if schedule.steps is not None:
        hours = (schedule.steps * step + sum(around.values())) / 3600
        if hw.price_per_gpu_hour is not None:
            cost = hours * hw.price_per_gpu_hour * job.world
    return SpeedEstimate(
        step_time_s=step,
        tokens_per_s_per_gpu=processed_per_s * data.useful_share,
        mfu=processed_per_s * model_flops / (peak * 1e12),
        parts=parts,
        around_s=around,
        steps=schedule.steps,
        steps_source=schedule.steps_source,
        hours=hours,
        cost=cost,
        notes=tuple(notes),
        processed_tokens_per_s_per_gpu=processed_per_s,
        data=data,
    )


def _data_shape(job: Job, schedule: Schedule) -> DataShape:
    """How the job's rows fill a micro batch: the schedule's (measured, or the published run's) for SFT, else
    whole rows (DPO and KTO pad pairs; GRPO's answers are the model's own)."""
    if job.objective == "sft" and schedule.data is not None:
        return schedule.data
    return full_rows(job.seq_len)


def assumed_ring_gbps(hw: Hardware, per_machine: int, machines: int) -> tuple[float, str]:
    """(the bus bandwidth in GB/s an all-reduce over every rank gets on these links, as the estimate assumes it; the
    link that sets it, in words): what a run's measured bandwidth (recipe/network.py) is compared with."""
    link = hw.inter if machines > 1 else hw.intra
    return _bandwidth(hw, per_machine, machines)[0] / 1e9, INTERCONNECTS[link][2].split(":")[0]


def _bandwidth(hw: Hardware, per_machine: int, machines: int) -> tuple[float, float]:
    """(bytes/s per GPU on a ring over every rank, bytes/s per machine between machines)."""
    intra_rate, _, _ = INTERCONNECTS[hw.intra]
    inter_rate, scope, _ = INTERCONNECTS[hw.inter]
    intra = intra_rate * 1e9 * NCCL_EFFICIENCY
    inter_machine = inter_rate * 1e9 * NCCL_EFFICIENCY * (per_machine if scope == "nic-per-gpu" else 1)
    if machines <= 1:
        return intra, inter_machine
    if hw.measured_ring_gbps:  # measured over every rank: the ring's pace itself
        ring = hw.measured_ring_gbps * 1e9
        return ring, ring * per_machine
    return min(intra, inter_machine / per_machine), inter_machine  # the ring's slowest link sets the pace


def _exposed_comms(job: Job, hw: Hardware, micro: float, ga: int, trainable: int) -> tuple[float, list[str]]:
    """Seconds per optimizer step that communication adds to compute."""
    n, machines = job.world, job.machines
    if n <= 1:
        return 0.0, []
    g = job.per_machine
    ring, inter_machine = _bandwidth(hw, g, machines)
    adapter_bytes = 4 if job.method != "full" or job.weight_bytes == 4 else 2  # LoRA adapters stay fp32
    grads = trainable * adapter_bytes
    weights = frozen_base_params(job) if job.method == "qlora" else job.arch.num_parameters * job.compute_bytes
    rs = (n - 1) / n / ring  # seconds per byte of a reduce-scatter or all-gather over every rank
    backward = 2 / 3 * micro  # what gradient traffic can hide behind
    layout = job.layout
    if not layout.shards_gradients:  # DDP, ZeRO-1
        exposed = max(0.0, 2 * rs * grads - backward)
        if layout.shards_optimizer:  # ZeRO-1
            exposed += rs * trainable * job.compute_bytes  # gathering the updated weights
    elif not layout.shards_parameters:  # ZeRO-2
        exposed = ga * max(0.0, rs * grads - backward) + rs * trainable * job.compute_bytes
    elif layout.gathers_per_layer and not layout.hybrid:  # ZeRO-3, FSDP FULL_SHARD
        gathers = ga * 2 * rs * weights  # forward and backward, every micro-step
        reduce = (ga if layout.is_deepspeed else 1) * rs * grads  # FSDP skips it on no_sync micro-steps
        exposed = max(0.0, gathers + reduce - ga * micro)
    elif layout.keeps_gathered:  # FSDP SHARD_GRAD_OP
        exposed = max(0.0, ga * rs * weights + rs * grads - ga * micro)
    else:  # HYBRID_SHARD: FULL_SHARD inside the machine, gradient shards all-reduced across machines
        local = (g - 1) / g / _bandwidth(hw, g, 1)[0] if g > 1 else 0.0
        across = 2 * (machines - 1) / machines * grads / inter_machine
        exposed = max(0.0, ga * 2 * local * weights + local * grads + across - ga * micro)
    notes = []
    if machines > 1 and exposed > 0.25 * (ga * micro + exposed):
        notes.append(f"{exposed / (ga * micro + exposed):.0%} of each step waits on the network between machines")
    return exposed, notes


def _gather_rate(job: Job, hw: Hardware) -> float:
    """Seconds per byte of an all-gather over the ranks the weights are sharded on (0 when they are not)."""
    n = job.shards
    if n <= 1 or not job.layout.shards_parameters:
        return 0.0
    machines = 1 if job.layout.hybrid else job.machines
    return (n - 1) / n / _bandwidth(hw, job.per_machine, machines)[0]


def _offload(job: Job, trainable: int) -> float:
    """Seconds per step of offload traffic and the CPU optimizer step (not hidden: they follow the backward pass)."""
    if job.offload_optimizer == "none" and job.offload_params == "none":
        return 0.0
    shard = trainable / job.world  # each rank moves and updates its shard
    per_machine = trainable / job.machines
    seconds = shard * (4 + job.compute_bytes) / (PCIE_HOST_GBPS * 1e9)  # gradients down, weights up
    seconds += per_machine * CPU_ADAM_BYTES / (HOST_MEMORY_GBPS * 1e9)
    if job.offload_params != "none":  # the weights cross PCIe for forward and backward
        seconds += 2 * job.arch.num_parameters * job.compute_bytes / job.world / (PCIE_HOST_GBPS * 1e9)
    if "nvme" in (job.offload_optimizer, job.offload_params):
        seconds += per_machine * 2 * 12 / (NVME_GBPS * 1e9)  # fp32 weight and moments, read and written
    return seconds


def _around_steps(job: Job, schedule: Schedule, flops_per_s: float, trainable: int) -> dict[str, float]:
    """Seconds the run spends outside its training steps."""
    arch = job.arch
    load = arch.num_parameters * job.weight_bytes / (READ_GBPS * 1e9)  # every machine reads the checkpoint
    forward = flops.arch_flops_per_token(arch, 0, job.seq_len, True, False)[0] / 3  # flops of one forward a token
    row_s = job.seq_len * forward / (flops_per_s * job.world)  # one forward of one row, the ranks together
    # A DPO evaluation reads each pair's two answers with the model and its reference; KTO's reads each answer and
    # a mismatched one for its KL estimate, with both: four forward passes either way, two by the reference; ORPO's
    # and SimPO's read the pair's two with the model alone (objectives_table.Objective.eval_passes).
    objective = OBJECTIVES[job.objective]
    reference = objective.reference_passes * objective.sequences_per_row
    passes = objective.eval_passes
    if job.objective == "grpo":
        # GRPO's writes grpo.num_generations answers to each held-out prompt and scores them: two forwards an answer
        # as FLOPs (three with a KL reference); the decode's bandwidth bound is not added.
        passes = job.num_generations * (2 + job.kl_reference)
    if job.precomputed_reference:  # scored once before training, the held-out rows too
        passes -= reference
    eval_s = passes * schedule.eval_passes * schedule.eval_rows * row_s
    if job.method == "full":  # weights and Adam's fp32 weight and moments
        checkpoint = arch.num_parameters * (job.weight_bytes + 12)
    else:
        checkpoint = trainable * 12
    return {
        "startup": STARTUP_S,
        "load": load,
        "eval": eval_s,
        "checkpoints": schedule.saves * checkpoint / (WRITE_GBPS * 1e9),
        # preference.precompute_ref_log_probs: the reference scores every training and held-out row once
        "reference": reference * (schedule.train_rows + schedule.eval_rows) * row_s
        if job.precomputed_reference
        else 0.0,
    }
