"""Per-GPU memory of a fine-tuning job in its two phases: loading the model, and training.

Pure: depends only on the spec and the catalog (no torch), and one estimate takes well
under a millisecond, so the panel recomputes it on every form change.

Units: "GB" here is GiB (2**30 bytes), the unit nvidia-smi and NVML report.

  load   backend/estimate/memory_load.py: from_pretrained until FSDP or DeepSpeed has sharded the
         model. With bitsandbytes every GPU first holds the whole quantized model, so a 70B
         QLoRA job needs about 35 GB per GPU whatever the number of GPUs.
  train  backend/estimate/memory_train.py: the peak of a training step, term by term.
  save   backend/estimate/memory_save.py: what saving a checkpoint or the final model adds to training.
The peak on a GPU is the larger phase: the caching allocator keeps what the load reserved
(transformers reserves the whole model in one block first: caching_allocator_warmup), and
nvidia-smi shows it through training.

tests/data/measured_peaks.yaml holds published measured peaks; bench/estimate_accuracy.py prints how close
the model comes to each, on the rows bench/fit_memory.py fitted the allocator constants on and on the held-out
third (tests/estimate/test_published.py holds the goals).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunedeck.backend.estimate.memory_allocator import FITTED, AllocatorConstants
from tunedeck.backend.estimate.memory_job import GIB, Job, input_values
from tunedeck.backend.estimate.memory_load import LOAD_TERMS, load_phase
from tunedeck.backend.estimate.memory_save import SavePeak, save_peak
from tunedeck.backend.estimate.memory_train import train_phase
from tunedeck.backend.spec import JobSpec

TERMS: dict[str, str] = {
    "weights": "Weights",
    "gradients": "Gradients",
    "optimizer": "Optimizer states",
    "adapter": "LoRA adapter",
    "reference": "Reference model (DPO, KTO, GRPO with KL)",
    "activations": "Activations",
    "logits": "Logits and loss",
    "gathered": "Gathered parameters",
    "generation": "Generation: KV cache and logits (GRPO)",
    "generation_gathered": "Generation: gathered weights (GRPO, ZeRO-3)",
    "buckets": "Communication buckets",
    "cuda_context": "CUDA context",
    "allocator": "Allocator overhead",
}
# Terms that are real tensors (what torch.cuda.max_memory_allocated sees).
TENSOR_TERMS = (
    "weights",
    "gradients",
    "optimizer",
    "adapter",
    "reference",
    "activations",
    "logits",
    "gathered",
    "generation",
    "generation_gathered",
    "buckets",
)
LOAD_TENSOR_TERMS = ("weights", "reference", "adapter", "in_flight")
# What a GPU still holds between steps, when a save runs: the step's activations and gathers are gone.
SAVE_KEPT_TERMS = ("weights", "gradients", "optimizer", "adapter", "reference", "buckets", "cuda_context")
PHASES = ("load", "train")


@dataclass(frozen=True)
class Estimate:
    per_gpu_gb: float  # peak on one GPU as nvidia-smi shows it: the larger phase
    cpu_gb: float  # host RAM per machine for offloaded states, while training
    nvme_gb: float  # NVMe space per machine for offloaded states
    breakdown: dict[str, float]  # training phase: GB per term (TERMS), per GPU
    params: int
    trainable_params: int
    notes: tuple[str, ...] = ()
    load_breakdown: dict[str, float] = field(default_factory=dict)  # load phase: GB per LOAD_TERMS, per GPU
    load_cpu_gb: float = 0.0  # host RAM per machine while the model loads
    load_path: str = ""  # how this job's strategy loads the model, in words
    save: SavePeak = field(default_factory=lambda: SavePeak(0.0, 0.0, 0.0, ""))  # what a save adds to training

    @property
    def save_gpu_gb(self) -> float:
        """GB on one GPU while a save runs: what stays between steps plus what the save gathers at once."""
        return sum(self.breakdown.get(t, 0.0) for t in SAVE_KEPT_TERMS) + self.save.gpu_gb

    @property
    def save_host_gb(self) -> float:
        """Host RAM per machine while a save runs: training's (offloaded states) plus the save's copy."""
        return self.cpu_gb + self.save.host_gb

    @property
    def phases(self) -> dict[str, float]:
        """GB per GPU of each phase: {"load": ..., "train": ...}."""
        return {"load": sum(self.load_breakdown.values()), "train": sum(self.breakdown.values())}

    @property
    def limiting_phase(self) -> str:
        """The phase that sets the peak: "load" or "train"."""
        phases = self.phases
        return "load" if phases["load"] > phases["train"] else "train"

    @property
    def host_gb(self) -> float:
        """Host RAM per machine at the worse phase."""
        return max(self.cpu_gb, self.load_cpu_gb)

    @property
    def allocated_gb(self) -> float:
        """The tensors alone: what torch.cuda.max_memory_allocated reports over the run."""
        return max(self._train_tensors, self._load_tensors)

    @property
    def reserved_gb(self) -> float:
        """Tensors plus the caching allocator's overhead: torch.cuda.max_memory_reserved."""
        return max(self._train_tensors + self.breakdown["allocator"], self._load_tensors)

    @property
    def _train_tensors(self) -> float:
        return sum(self.breakdown[t] for t in TENSOR_TERMS)

    @property
    def _load_tensors(self) -> float:
        return sum(self.load_breakdown.get(t, 0.0) for t in LOAD_TENSOR_TERMS)

    def phase_view(self, measure: str, phase: str = "peak") -> float:
        """GB a measurement sees: measure is allocated, reserved or device (nvidia-smi);
        phase is load (loading the model), train (the step alone) or peak (load and train, the whole run)."""
        if phase == "peak":
            return {"allocated": self.allocated_gb, "reserved": self.reserved_gb, "device": self.per_gpu_gb}[measure]
        if phase == "load":
            return self.phases["load"] if measure == "device" else self._load_tensors
        tensors = self._train_tensors
        return {
            "allocated": tensors,
            "reserved": tensors + self.breakdown["allocator"],
            "device": self.phases["train"],
        }[measure]

    def to_dict(self) -> dict:
        return {
            "per_gpu_gb": round(self.per_gpu_gb, 2),
            "phases": {k: round(v, 2) for k, v in self.phases.items()},
            "limited_by": self.limiting_phase,
            "cpu_gb": round(self.cpu_gb, 2),
            "load_cpu_gb": round(self.load_cpu_gb, 2),
            "nvme_gb": round(self.nvme_gb, 2),
            "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
            "load_breakdown": {k: round(v, 3) for k, v in self.load_breakdown.items()},
            "load_path": self.load_path,
            "params": self.params,
            "trainable_params": self.trainable_params,
            "notes": list(self.notes),
            "save": {
                **self.save.to_dict(),
                "gpu_gb": round(self.save_gpu_gb, 2),
                "host_gb": round(self.save_host_gb, 2),
            },
        }


def estimate(
    spec: JobSpec, *, loss: str | None = None, software: str = "tunedeck", allocator: AllocatorConstants = FITTED
) -> Estimate:
    """Peak memory per GPU of the job exactly as given, trained by tunedeck (or, to compare with a published run,
    by another software of backend/estimate/memory_software.py; `loss` overrides how it computes the loss). `allocator`:
    other allocator constants than the fitted ones (bench/fit_memory.py tries them)."""
    return estimate_values(input_values(spec, loss, software), allocator)


def estimate_values(v: dict, allocator: AllocatorConstants = FITTED) -> Estimate:
    """The estimate of a job given as input_values (a variant: the values with changes applied)."""
    job = Job.from_values(v)
    train, cpu, nvme, notes = train_phase(job, allocator)
    load, load_host, how = load_phase(job)
    if job.use_cpu:
        notes.append("CPU run: the figures are RAM per process, not GPU memory")
    breakdown = {k: train.get(k, 0.0) / GIB for k in TERMS}
    load_breakdown = {k: load.get(k, 0.0) / GIB for k in LOAD_TERMS}
    return Estimate(
        per_gpu_gb=max(sum(breakdown.values()), sum(load_breakdown.values())),
        cpu_gb=cpu / GIB,
        nvme_gb=nvme / GIB,
        breakdown=breakdown,
        params=job.arch.num_parameters,
        trainable_params=job.trainable_params,
        notes=tuple(notes),
        load_breakdown=load_breakdown,
        load_cpu_gb=load_host / GIB,
        load_path=how,
        save=save_peak(job),
    )
