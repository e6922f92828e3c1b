"""A run in words, for the CLI and the panel alike: what it got, how far it is, what it measured.

Computed from a run's records (run_folder.RunRecords) and its status times only, so
`tunedeck train`'s progress line, `tunedeck runs`, `runs show` and the panel's run view say
the same thing about the same run:

    facts      "2 ranks · DDP · 18.1% of parameters trainable (1,234 of 6,818) · lora · DistributedDataParallel"
               (a GRPO run: "... · GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)")
    progress   "step 12/30 · elapsed 0:14 · ETA 0:21"
    report     "final loss 1.083 · best 1.021 at step 52 · 61,440 tokens · 0:41 wall · 2,310 tokens/s"
               ("latest loss" while the run goes on; a GRPO run's reward first: "reward 0.410 → 0.852 · ...")
    verdict    "smoke test passed: 2 ranks on 1 machine · DDP · 1,234 trainable parameters; loss ..."
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.recipe import GENERAL_TEXT_LOSS
from tunedeck.backend.recipe.general_text import RISE_FLAGGED as GENERAL_RISE_FLAGGED
from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.runs.job_file import UnreadableJob
from tunedeck.backend.runs.network import network_line
from tunedeck.backend.runs.records import RunRecords, StartRecord
from tunedeck.backend.spec import JobSpec


def format_clock(seconds: float) -> str:
    """Elapsed time or ETA as people read it: 0:21, 12:05, 3:07:44."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def run_title(job: JobSpec) -> str:
    """A job in one line, the title of its run: model · method (and DPO) · strategy · processes."""
    model = job.model.name_or_path
    if os.path.isabs(model) or model.startswith("."):
        model = "/".join(Path(model).parts[-2:])  # a local folder: its last two names say enough
    where = "CPU" if job.launch.use_cpu else "GPU"
    method = f"{job.method}{'' if job.objective == 'sft' else f' {job.objective}'}"
    return f"{model} · {method} · {job.strategy.kind} · {job.launch.num_processes}x{where}"


# ---------------------------------------------------------------- what the run got


def strategy_label(start: StartRecord) -> str:
    """The strategy the run really got, from its start record: "DeepSpeed ZeRO-3", "FSDP2", "DDP"."""
    kind = start.get("distributed_type")
    if (stage := start.get("zero_stage")) is not None:
        per_sequence = start.get("sequence_parallel") or 1
        return f"DeepSpeed ZeRO-{stage}" + (f" + {per_sequence} GPUs per sequence" if per_sequence > 1 else "")
    if kind == "DEEPSPEED":
        return "DeepSpeed"
    if kind == "FSDP" or start.get("fsdp"):
        return f"FSDP{start.get('fsdp_version') or ''}"
    if kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"):
        return "DDP"
    if kind == "NO":
        return "single process"
    return str(kind or "?")


def _ranks(start: StartRecord, always_machines: bool = False) -> str:
    """The ranks, e.g. "2 ranks", with "on 2 machines (n0, n1)" when they span several (or always_machines)."""
    world = start.get("world_size")
    text = f"{world} rank{'s' * (world != 1)}" if world is not None else "? ranks"
    machines = list(dict.fromkeys(start.get("nodes") or []))
    if len(machines) > 1 or always_machines:
        count = max(1, len(machines))
        text += f" on {count} machine{'s' * (count != 1)}"
        if 1 < count <= 4:
            text += f" ({', '.join(machines)})"
    return text


def grpo_facts(start: StartRecord, job: JobSpec | UnreadableJob | None = None) -> str:
    """A GRPO run's objective: 'GRPO, rewards: exact_answer, close_answer · reference: none (grpo.beta 0)' (the
    rewards are the job's, job.yaml's grpo.rewards; your own reward by its file's name and function)."""
    grpo = job.grpo if isinstance(job, JobSpec) else None  # no job, or one of another version: no rewards named
    rewards = grpo.rewards if grpo else []
    text = "GRPO" + (f", rewards: {', '.join(Path(r).name for r in rewards)}" if rewards else "")
    beta = f" (grpo.beta {grpo.beta:g})" if grpo else ""
    reference = start.get("reference")
    if not reference:  # train.py's reference_model: None without a KL weight
        return f"{text} · reference: none{beta or ' (grpo.beta 0)'}"
    return f"{text} · reference: {reference}{beta}"


def facts_line(start: StartRecord | None, job: JobSpec | UnreadableJob | None = None) -> str:
    """The start record in one line, e.g. '2 ranks · DeepSpeed ZeRO-3 · 0.4% of parameters trainable (...) · qlora';
    a GRPO run's objective with its rewards, read from `job` (the run's job.yaml) when given."""
    if not start:
        return ""
    parts = [_ranks(start), strategy_label(start)]
    trainable, total = start.get("trainable_params"), start.get("total_params")
    if trainable is not None and total:
        share = trainable / total
        parts.append(
            f"{100 * share:.{1 if share >= 0.001 else 3}f}% of parameters trainable ({trainable:,} of {total:,})"
        )
    parts += [said for said in (start.get("method"), start.get("model_class")) if said]
    objective = OBJECTIVES.get(start.get("objective") or "sft")
    if objective and objective.name == "grpo":
        parts.append(grpo_facts(start, job))
    elif objective and objective.needs_reference:
        parts.append(f"{objective.title}, reference: {start.get('reference') or '?'}")
    elif objective and objective.name != "sft":
        parts.append(f"{objective.title}, reference-free")
    return " · ".join(parts)


# ---------------------------------------------------------------- how far it is


@dataclass(frozen=True)
class RunSummary:
    facts: str  # facts_line: "" until the start record
    strategy: str  # strategy_label: "" until the start record
    step: int
    max_steps: int | None
    fraction: float  # of max_steps done
    elapsed_s: float | None  # None before the run started
    eta_s: float | None  # None once ended, or before two log records
    last_loss: float | None  # the last training loss logged
    last_reward: float | None = None  # a GRPO run's last mean reward: its measure (its loss stays near 0)
    phase: str | None = None  # before the first step: what it does ("loading the model for 0:42"; run_startup.py)
    network: str = ""  # the network the run measured beside the one the estimate assumed (network.py); "" if none

    @property
    def steps(self) -> str:
        """'12/30' (or '12' while the total is unknown)."""
        return f"{self.step}/{self.max_steps}" if self.max_steps else str(self.step)

    @property
    def measure(self) -> str:
        """The last loss, or a GRPO run's last reward ('reward 0.846'); '' before either."""
        if self.last_reward is not None:
            return f"reward {self.last_reward:.3f}"
        return "" if self.last_loss is None else f"{self.last_loss:.4f}"

    @property
    def step_text(self) -> str:
        return f"step {self.steps}"

    @property
    def progress(self) -> str:
        """'step 12/30 · elapsed 0:14 · ETA 0:21' ('step 0/30 · loading the model for 0:42 · elapsed 1:02')."""
        parts = [self.step_text] + ([self.phase] if self.phase else [])
        if self.elapsed_s is not None:
            parts.append(f"elapsed {format_clock(self.elapsed_s)}")
        if self.eta_s is not None:
            parts.append(f"ETA {format_clock(self.eta_s)}")
        return " · ".join(parts)


def summarize(
    run: RunRecords,
    started_at: float | None,
    ended_at: float | None,
    now: float | None = None,
    job: JobSpec | UnreadableJob | None = None,
    phase: str | None = None,
) -> RunSummary:
    """The run's summary at `now` (default: now). The ETA is the pace the last log record states; `job` (the run's
    job.yaml) names a GRPO run's rewards in its facts; `phase`, what a live run does before its first step."""
    now = now or time.time()
    last = run.last or {}
    step = last.get("step", 0)
    total = last.get("max_steps") or (run.start or {}).get("max_steps")
    pace = last.get("seconds_per_step")
    eta = (total - step) * pace if ended_at is None and total and pace else None
    return RunSummary(
        facts=facts_line(run.start, job),
        strategy=strategy_label(run.start) if run.start else "",
        step=step,
        max_steps=total,
        fraction=min(1.0, step / total) if total else 0.0,
        elapsed_s=((ended_at or now) - started_at) if started_at else None,
        eta_s=eta,
        last_loss=next((record["loss"] for record in reversed(run.records) if "loss" in record), None),
        last_reward=next((record["reward"] for record in reversed(run.records) if "reward" in record), None),
        phase=phase if ended_at is None and not run.records else None,
        network=network_line(dict(run.start)) or "" if run.start else "",
    )


def health_lines(run: RunRecords) -> list[str]:
    """What the training-health guard saw and did (training.health): each roll-back, then a symptom the run
    trains on with (warn) and its likely causes. A symptom that stopped the run is its error, said there."""
    lines = []
    for record in run.health:
        if record.get("action") == "rolled back":
            lines.append(
                f"↺ roll-back {record.get('rollbacks', '')}: {record.get('line', 'unhealthy')} → resumed from the "
                f"checkpoint at step {record.get('checkpoint_step')}, learning rate x{record.get('lr_scale', 1):g}, "
                f"{record.get('skip_steps', 0)} steps of data skipped"
            )
    last = run.unhealthy
    if last and last.get("action") == "warned":
        lines.append(f"{last.get('line', '⚠ unhealthy')} · trains on (training.health.policy=warn)")
        lines += [f"  hint: {hint}" for hint in last.get("hints", [])[:3]]
    return lines


def restart_cost(run: RunRecords, attempts: list[dict]) -> str | None:
    """What the restarts after failures cost a run: the steps trained again, and the time from each failure to the
    next attempt's first logged step (the wait before it, the start, the checkpoint's load)."""
    restarts = [a for a in attempts if a.get("retried") and isinstance(a.get("ended_at"), (int, float))]
    if not restarts:
        return None
    waits = []
    for attempt in restarts:
        ended = attempt["ended_at"]
        times = (t for r in run.records if isinstance(t := r.get("time"), (int, float)))
        first = next((t for t in times if t > ended), None)
        if first is not None:
            waits.append(first - ended)
    again = len({r.get("step") for r in run.superseded})
    waited = f" · {format_clock(sum(waits))} from the failure to the next attempt's first step" if waits else ""
    return f"{len(restarts)} restart{'s' * (len(restarts) > 1)} after failures · {again} steps trained again{waited}"


def measured_peaks(run: RunRecords) -> dict[str, list[float]]:
    """Highest GPU memory per rank seen so far (GB): {'allocated': [...], 'reserved': [...]}."""
    peaks: dict[str, list[float]] = {}
    for record in run.records:
        for key, label in (("gpu_peak_allocated_gb", "allocated"), ("gpu_peak_reserved_gb", "reserved")):
            values = record.get(key)
            if values:
                old = peaks.get(label, [0.0] * len(values))
                peaks[label] = [max(a, b) for a, b in zip(old, values)] if len(old) == len(values) else values
    return peaks


# ---------------------------------------------------------------- what it achieved


@dataclass(frozen=True)
class RunReport:
    """A run's results so far, from its log records and status times (None: not known)."""

    final_loss: float | None  # the last training loss logged
    best_loss: float | None
    best_step: int | None
    eval_loss: float | None  # the last evaluation loss
    tokens: int | None  # training tokens seen, all ranks (TRL's num_tokens)
    wall_s: float | None  # from start to end (now, while live): loading and saving included
    tokens_per_s: float | None  # the mean of the logged windows' throughput
    peak_gb: float | None  # the highest GPU memory allocated on any rank (GPU runs only)
    resumed_from_step: int | None
    ended: bool = True  # False while the run goes on: its last loss is the latest one, not the final one
    # GRPO: the answers' mean reward at the first and the last logging step, the last on the held-out prompts
    first_reward: float | None = None
    last_reward: float | None = None
    eval_reward: float | None = None
    saved_on_processes: int | None = None  # a resume on another number of processes: the number it was saved on
    # dataset.general_text: the general-text loss at the first evaluation (before the first step) and the last
    first_general: float | None = None
    last_general: float | None = None

    def general_text(self) -> str | None:
        """'general text 3.10 → 3.52 (+14%) ⚠ forgetting general language' (the flag above RISE_FLAGGED), or None."""
        if self.first_general is None or self.last_general is None or self.first_general <= 0:
            return None
        share = self.last_general / self.first_general - 1
        said = f"general text {self.first_general:.3f} → {self.last_general:.3f} ({share:+.0%})"
        return f"⚠ {said}: forgetting general language" if share > GENERAL_RISE_FLAGGED else said

    def line(self) -> str:
        """'final loss 1.083 · best 1.021 at step 52 · ...' ('latest loss' while live), the parts that are known."""
        wall = format_clock(self.wall_s) if self.wall_s is not None else None
        shown = (
            ("resumed from step {}", self.resumed_from_step or None),
            ("saved on {} processes", self.saved_on_processes if self.resumed_from_step else None),
            ("reward {:.3f} → {:.3f}", self.first_reward, self.last_reward),
            ("eval reward {:.3f}", self.eval_reward),
            ("final loss {:.4f}" if self.ended else "latest loss {:.4f}", self.final_loss),
            ("best {:.4f} at step {}", self.best_loss, self.best_step),
            ("eval loss {:.4f}", self.eval_loss),
            ("{}", self.general_text()),
            ("{:,} tokens", self.tokens),
            ("{} wall", wall),
            ("{:,.0f} tokens/s mean", self.tokens_per_s),
            ("peak {:.2f} GB per GPU", self.peak_gb),
        )
        return " · ".join(text.format(*values) for text, *values in shown if values[0] is not None)


def saved_on_other_processes(start: StartRecord | None) -> int | None:
    """The data-parallel processes a resumed run's checkpoint was saved on, when other than the run's own."""
    if start is None:
        return None
    saved = (start.get("restored") or {}).get("saved") or {}
    here = start.get("world_size", 1) // (start.get("sequence_parallel") or 1)
    return saved.get("data_parallel") if saved.get("data_parallel") not in (None, here) else None


def report(run: RunRecords, started_at: float | None, ended_at: float | None, now: float | None = None) -> RunReport:
    """The run's results at `now` (default: now); non-finite values are left out."""
    losses = [(r["step"], r["loss"]) for r in run.records if "loss" in r and "step" in r and math.isfinite(r["loss"])]
    best = min(losses, key=lambda pair: pair[1], default=(None, None))
    evals = [r["eval_loss"] for r in run.records if "eval_loss" in r and math.isfinite(r["eval_loss"])]
    tokens = next((r["num_tokens"] for r in reversed(run.records) if "num_tokens" in r), None)
    speeds = [r["tokens_per_second"] for r in run.records if "tokens_per_second" in r]
    speeds = [v for v in speeds if math.isfinite(v)]
    peaks = measured_peaks(run).get("allocated")
    rewards = [r["reward"] for r in run.records if "reward" in r and math.isfinite(r["reward"])]
    eval_rewards = [r["eval_reward"] for r in run.records if "eval_reward" in r and math.isfinite(r["eval_reward"])]
    general = [float(v) for r in run.records if math.isfinite(v := r.get(GENERAL_TEXT_LOSS, math.nan))]
    if rewards:  # GRPO's loss stays near 0 whatever the answers: its lowest says nothing
        best = (None, None)
    return RunReport(
        final_loss=losses[-1][1] if losses else None,
        best_loss=best[1],
        best_step=best[0],
        eval_loss=evals[-1] if evals else None,
        tokens=int(tokens) if tokens is not None and math.isfinite(tokens) else None,
        wall_s=((ended_at or now or time.time()) - started_at) if started_at else None,
        tokens_per_s=sum(speeds) / len(speeds) if speeds else None,
        peak_gb=max(peaks) if peaks else None,
        resumed_from_step=(run.start or {}).get("resumed_from_step"),
        saved_on_processes=saved_on_other_processes(run.start),
        ended=ended_at is not None,
        first_reward=rewards[0] if rewards else None,
        last_reward=rewards[-1] if rewards else None,
        eval_reward=eval_rewards[-1] if eval_rewards else None,
        first_general=general[0] if len(general) > 1 else None,
        last_general=general[-1] if len(general) > 1 else None,
    )


# ---------------------------------------------------------------- a smoke run's verdict


@dataclass(frozen=True)
class Verdict:
    passed: bool
    line: str  # "smoke test passed: ..." or "smoke test FAILED: ..."


def verdict(run: RunRecords) -> Verdict:
    """Passed when the run finished (the sanity gate included) and every logged loss is finite."""
    end = run.end or {}
    if end.get("status") != "finished":
        why = end.get("error") or end.get("status") or "the run ended without an end record"
        return Verdict(False, f"smoke test FAILED: {why}")
    losses = [(record["step"], record["loss"]) for record in run.records if "loss" in record and "step" in record]
    bad = next(((step, loss) for step, loss in losses if not math.isfinite(loss)), None)
    if bad is not None:
        return Verdict(False, f"smoke test FAILED: the loss is not finite ({bad[1]}) at step {bad[0]}")
    if not losses or run.start is None:
        return Verdict(False, "smoke test FAILED: the run logged no training loss")
    start = run.start
    got = [_ranks(start, always_machines=True), strategy_label(start)]
    got += [f"{count} x {name}" for name, count in (start.get("quantized_modules") or {}).items()]
    got.append(f"{start.get('trainable_params', 0):,} trainable parameters")
    first, final = losses[0][1], losses[-1][1]
    rewards = [record["reward"] for record in run.records if "reward" in record]  # GRPO's measure
    reward = f", reward {rewards[0]:.3f} -> {rewards[-1]:.3f}" if rewards else ""
    return Verdict(
        True, f"smoke test passed: {' · '.join(got)}; loss {first:.3f} -> {final:.3f}{reward} over {len(losses)} steps"
    )
