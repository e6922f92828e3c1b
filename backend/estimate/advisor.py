"""Which strategy to use: every sensible strategy for a job, whether it fits, and the advice.

The advice is computed once per change into one `Advice` (the job as given, every strategy
option, the recommendation) that the CLI (`tunedeck estimate`) and the panel's table, chart,
text and Apply button all read. A strategy fits when its larger phase (loading or training,
backend/estimate/memory.py) stays below FIT_FRACTION of the GPU, and its host RAM below that share of
the machine's RAM when that is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tunedeck.backend.estimate.advisor_options import candidates, sequence_parallel, strategy_key
from tunedeck.backend.estimate.advisor_sequence import sequence_candidates, sequence_reason, sequence_sizes
from tunedeck.backend.estimate.gpu_fit import FIT_FRACTION, fits, format_gb
from tunedeck.backend.estimate.memory import Estimate, estimate_values
from tunedeck.backend.estimate.memory_job import Job, input_values, variant
from tunedeck.backend.estimate.speed import TIE_SHARE, Hardware, Schedule, SpeedEstimate, predict
from tunedeck.backend.recipe.layout import Layout
from tunedeck.backend.spec import JobSpec

# More GPUs per sequence are weighed when the rows' activations and loss tensors are at least this share of
# the training peak: below it the model states overflow, and splitting the sequence cannot make them fit.
ACTIVATION_SHARE = 0.5


@dataclass(frozen=True)
class StrategyEstimate:
    strategy: str  # label, e.g. "ZeRO-3 + CPU offload"
    changes: dict[str, Any]  # dotted path -> value that turns the current job into this strategy
    estimate: Estimate
    fits: bool
    layout: Layout  # the option's layout (backend/recipe/layout.py): what it shards and offloads
    current: bool = False  # the job as given already uses this strategy
    speed: SpeedEstimate | None = None  # predicted step time and throughput (backend/estimate/speed.py)

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "changes": self.changes,
            "fits": self.fits,
            "current": self.current,
            **self.estimate.to_dict(),
            **speed_dict(self.speed),
        }


SPEED_KEYS = ("step_time_s", "tokens_per_s_per_gpu", "hours", "cost")


def speed_dict(speed: SpeedEstimate | None) -> dict:
    """The speed keys of a JSON report: always present, None where nothing is predicted."""
    return speed.to_dict() if speed is not None else dict.fromkeys(SPEED_KEYS)


@dataclass(frozen=True)
class Recommendation:
    strategy: str | None  # None when nothing fits
    changes: dict[str, Any]  # only the values that differ from the current job
    reason: str  # one sentence
    estimate: Estimate | None
    fits: bool

    def to_dict(self) -> dict:
        out = {"strategy": self.strategy, "changes": self.changes, "reason": self.reason, "fits": self.fits}
        if self.estimate is not None:
            out.update(self.estimate.to_dict())
        return out


@dataclass(frozen=True)
class Advice:
    """Everything the memory views show for one job on one GPU size, computed once."""

    gpu_mem_gb: float
    cpu_mem_gb: float | None  # host RAM per machine, None when unknown (not checked)
    current: Estimate  # the job exactly as given
    options: list[StrategyEstimate]  # fastest first
    recommendation: Recommendation
    current_speed: SpeedEstimate | None = None
    hardware: Hardware | None = None

    @property
    def current_fits(self) -> bool:
        return fits(self.current, self.gpu_mem_gb, self.cpu_mem_gb)

    def to_dict(self) -> dict:
        return {
            "gpu_mem_gb": round(self.gpu_mem_gb, 2),
            "cpu_mem_gb": None if self.cpu_mem_gb is None else round(self.cpu_mem_gb, 2),
            "current": {"fits": self.current_fits, **self.current.to_dict(), **speed_dict(self.current_speed)},
            "strategies": [o.to_dict() for o in self.options],
            "recommended": self.recommendation.to_dict(),
        }


# ---------------------------------------------------------------- public API


def advise(
    spec: JobSpec,
    gpu_mem_gb: float,
    *,
    cpu_mem_gb: float | None = None,
    loss: str = "fused",
    hardware: Hardware | None = None,
    schedule: Schedule | None = None,
    correction: float = 1.0,
    seq_len: int | None = None,
) -> Advice:
    """The job as given, every strategy option and the recommendation, in one pass.

    With hardware and schedule, each option also gets its predicted speed, and the recommendation
    is the fastest prediction that fits (correction: throughput factor from the user's own runs).
    `seq_len`: the longest sequence the data really has (backend/data/preview.py), when measured; else
    every micro-batch is taken to be dataset.max_seq_length tokens long.
    """
    values = input_values(spec, loss)
    if seq_len is not None:
        values = variant(values, {"dataset.max_seq_length": min(seq_len, values["dataset.max_seq_length"])})

    def speed(v: dict) -> SpeedEstimate | None:
        if hardware is None or schedule is None:
            return None
        return predict(Job.from_values(v), hardware, schedule, correction)

    options = _compare(values, candidates(values), gpu_mem_gb, cpu_mem_gb, speed)
    options = _with_sequence_parallel(values, options, gpu_mem_gb, cpu_mem_gb, speed)
    return Advice(
        gpu_mem_gb=gpu_mem_gb,
        cpu_mem_gb=cpu_mem_gb,
        current=estimate_values(values),
        options=options,
        recommendation=_recommend(values, options, gpu_mem_gb, cpu_mem_gb, hardware),
        current_speed=speed(values),
        hardware=hardware,
    )


# ---------------------------------------------------------------- comparing and choosing


def _compare(
    values: dict, options: list, gpu_mem_gb: float, cpu_mem_gb: float | None, speed=lambda v: None
) -> list[StrategyEstimate]:
    current = strategy_key(values)
    out = []
    for label, changes in options:
        job = variant(values, changes)
        est = estimate_values(job)
        out.append(
            StrategyEstimate(
                strategy=label,
                changes=changes,
                estimate=est,
                fits=fits(est, gpu_mem_gb, cpu_mem_gb),
                current=strategy_key(job) == current,
                speed=speed(job),
                layout=Layout.of_values(job),
            )
        )
    return out


def _with_sequence_parallel(values: dict, options: list, gpu_mem_gb: float, cpu_mem_gb: float | None, speed) -> list:
    """The options, with those of the smallest number of GPUs per sequence that fits (backend/estimate/advisor_sequence.py)
    before the offloading ones, when no option that trains as the job does fits without offloading, and the
    rows' activations are what overflows: at least ACTIVATION_SHARE of its leanest such option's training peak."""
    own = [o for o in options if _same_method(values, o) and not _offloads(o)]
    if not own or any(o.fits and _usable(values, o) for o in own):
        return options
    lean = min(own, key=lambda o: o.estimate.per_gpu_gb).estimate
    if lean.breakdown["activations"] + lean.breakdown["logits"] < ACTIVATION_SHARE * lean.phases["train"]:
        return options  # the model states overflow: more GPUs per sequence would not help
    for n in sequence_sizes(values):
        more = _compare(values, sequence_candidates(values, n), gpu_mem_gb, cpu_mem_gb, speed)
        if any(o.fits and _usable(values, o) for o in more):
            at = next((i for i, o in enumerate(options) if _offloads(o)), len(options))
            return options[:at] + more + options[at:]
    return options


def _usable(values: dict, option: StrategyEstimate) -> bool:
    """NVMe offload needs a fast local disk the job names; without one it is shown, not advised."""
    return bool(values["strategy.nvme_path"]) or "nvme" not in option.changes.values()


def _same_method(values: dict, option: StrategyEstimate) -> bool:
    return option.changes.get("method", values["method"]) == values["method"]


def _offloads(option: StrategyEstimate) -> bool:
    return option.changes.get("strategy.offload_optimizer", "none") != "none"


def _recommend(
    values: dict,
    options: list[StrategyEstimate],
    gpu_mem_gb: float,
    cpu_mem_gb: float | None,
    hardware: Hardware | None = None,
) -> Recommendation:
    usable = [o for o in options if _usable(values, o)]
    fitting = [o for o in usable if o.fits]
    if not fitting:
        return _nothing_fits(values, options, gpu_mem_gb, cpu_mem_gb)
    # Quantizing the base changes what is trained: it is the answer to memory, never to speed.
    same_method = [o for o in fitting if _same_method(values, o)]
    fitting = same_method or fitting
    chosen = _fastest(fitting)
    # Options of one tier are equally fast (ZeRO-3 and FSDP FULL_SHARD move the same bytes), and so are
    # predictions within TIE_SHARE of each other: the job's own choice among them stays.
    chosen = next((o for o in fitting if o.current and _as_fast(o, chosen)), chosen)
    changes = {k: v for k, v in chosen.changes.items() if values.get(k) != v}
    faster = [o for o in usable[: usable.index(chosen)] if not o.fits]
    reason = _reason(values, chosen, faster, gpu_mem_gb) + _speed_reason(values, chosen, fitting, hardware)
    return Recommendation(chosen.strategy, changes, reason, chosen.estimate, True)


def _tier(option: StrategyEstimate) -> tuple:
    """What sets an option's speed: what it trains, whether it shards the weights, what it offloads."""
    c, layout = option.changes, option.layout
    return (
        c.get("method"),
        c.get("strategy.sequence_parallel", 1),
        layout.is_ddp,
        layout.gathers_per_layer,
        layout.hybrid,
        c["strategy.offload_optimizer"],
        c["strategy.offload_params"],
    )


def _as_fast(option: StrategyEstimate, chosen: StrategyEstimate) -> bool:
    if _tier(option) == _tier(chosen):
        return True
    if option.speed is None or chosen.speed is None:
        return False
    return option.speed.pace <= chosen.speed.pace * (1 + TIE_SHARE)


def _fastest(fitting: list[StrategyEstimate]) -> StrategyEstimate:
    """The shortest predicted time per token (speed.py's pace: a step with more GPUs per sequence reads fewer rows);
    within TIE_SHARE of it, the guides' order. Without predictions, that order."""
    timed = [(o.speed.pace, o) for o in fitting if o.speed is not None]
    if not timed:
        return fitting[0]
    best = min(pace for pace, _ in timed)
    return next(o for pace, o in timed if pace <= best * (1 + TIE_SHARE))


def _speed_reason(v: dict, chosen: StrategyEstimate, fitting: list[StrategyEstimate], hw: Hardware | None) -> str:
    """By how much the choice is faster than the next that fits, and what the network costs across machines."""
    if chosen.speed is None:
        return ""
    text = f" Predicted {chosen.speed.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    others = sorted(
        ((o.speed.pace, o) for o in fitting if o is not chosen and o.speed is not None), key=lambda timed: timed[0]
    )
    if others:
        pace, other = others[0]
        ratio = pace / chosen.speed.pace
        if ratio < 1 + TIE_SHARE:
            decides = "the job's own choice stays" if chosen.current else "the guides' order decides"
            text += f", as fast as {other.strategy} (within {TIE_SHARE:.0%}: {decides})"
        else:
            text += f", {ratio:.2f}x the speed of {other.strategy} (the next fastest that fits)"
    text += "."
    if hw is not None and v["launch.num_machines"] > 1:
        link = hw.inter.replace("infiniband", "InfiniBand").replace("ethernet", "Ethernet")
        if chosen.layout.hybrid:
            text += (
                f" Across machines on {link}, hybrid sharding keeps the weight gathers inside each machine "
                "and sends only gradients between machines."
            )
        for note in chosen.speed.notes:
            text += f" On {link}, {note}: fewer machines, or a faster network, would finish sooner per GPU."
    return text


# ---------------------------------------------------------------- the reason sentence


def _nothing_fits(
    v: dict, options: list[StrategyEstimate], gpu_mem_gb: float, cpu_mem_gb: float | None
) -> Recommendation:
    smallest = min(options, key=lambda o: (o.estimate.per_gpu_gb, not o.current))  # the job's own on a tie
    est = smallest.estimate
    host = f" and {cpu_mem_gb:g} GB of CPU RAM" if cpu_mem_gb is not None else ""
    if est.limiting_phase == "load" and est.per_gpu_gb > FIT_FRACTION * gpu_mem_gb:
        # More GPUs do not help here: every GPU holds the whole (quantized) model while it loads.
        need = f"{format_gb(est.per_gpu_gb)} per GPU to load the model ({est.load_path})"
        fix = f"so use GPUs with at least {math.ceil(est.per_gpu_gb / FIT_FRACTION)} GB or a smaller model"
    else:
        need = format_gb(est.per_gpu_gb) + (f" and {est.host_gb:.0f} GB of CPU RAM" if est.host_gb else "")
        grpo = ", grpo.max_completion_length" if v["objective"] == "grpo" else ""  # and its answers written at once
        fix = f"so add GPUs, lower dataset.max_seq_length{grpo} or training.per_device_train_batch_size" + (
            "" if v["training.gradient_checkpointing"] else ", or turn on training.gradient_checkpointing"
        )
    reason = f"Nothing fits in {gpu_mem_gb:g} GB per GPU{host}: even {smallest.strategy} needs {need}, {fix}."
    return Recommendation(None, {}, reason, est, False)


def _need(option: StrategyEstimate, gpu_mem_gb: float) -> str:
    """What a strategy that does not fit would need: GPU memory (and in which phase) or host RAM."""
    est = option.estimate
    if est.per_gpu_gb > FIT_FRACTION * gpu_mem_gb:
        return format_gb(est.per_gpu_gb) + (" to load" if est.limiting_phase == "load" else "")
    phase = " to load" if est.load_cpu_gb > est.cpu_gb else ""
    return f"{est.host_gb:.0f} GB of CPU RAM{phase}"


def _reason(v: dict, chosen: StrategyEstimate, skipped: list[StrategyEstimate], gpu_mem_gb: float) -> str:
    """One sentence: what fits, what the faster option would need, and why this one."""
    est = chosen.estimate
    layout = chosen.layout
    method = chosen.changes.get("method", v["method"])
    per_sequence = sequence_parallel(variant(v, chosen.changes))
    if per_sequence > sequence_parallel(v):
        why = sequence_reason(v, per_sequence)
    elif method == "qlora" and v["method"] != "qlora":
        why = "storing the frozen base in 4-bit NF4 (QLoRA) is what makes this job fit"
        if v["method"] == "full":
            why += ", with adapters trained at learning rate 2e-4 instead of every weight"
    elif chosen.changes.get("strategy.offload_optimizer", "none") != "none":
        where = f"{est.cpu_gb:.0f} GB of CPU RAM" + (f" and {est.nvme_gb:.0f} GB of NVMe" if est.nvme_gb else "")
        why = f"offloading moves states to host memory ({where} per machine): slower steps, the last resort before quantizing"
    elif layout.is_ddp and method != "full":
        why = "only the adapter's gradients cross the network, so plain data parallelism is fastest"
    elif layout.is_ddp:
        why = "every GPU keeps everything and only gradients are all-reduced, the fastest setup"
    elif not layout.gathers_per_layer:
        why = (
            "it shards optimizer states and gradients while every GPU keeps whole weights, "
            "the usual choice for full fine-tuning of 7-13B models"
        )
    else:
        why = "it shards the weights as well and gathers each layer just in time: more communication, but it fits"
    skipped_text = f" ({skipped[0].strategy} would need {_need(skipped[0], gpu_mem_gb)})" if skipped else ""
    kept = " (as set)" if chosen.current else ""
    phase = " while loading" if est.limiting_phase == "load" else ""
    return (
        f"{chosen.strategy}{kept} is the fastest option that fits: {format_gb(est.per_gpu_gb)} of {gpu_mem_gb:g} GB "
        f"per GPU{phase}{skipped_text}; {why}."
    )
