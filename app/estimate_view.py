"""Pure builders of the panel's memory view: the strategy table, the stacked bar chart, the
recommendation and the measured-vs-predicted line of a run.

No Gradio here. The page computes one `Advice` per form change (`compute_advice`: the job,
every strategy, the recommendation; well under a millisecond) and every builder reads it.
An estimate error (an unknown model, a GPU size that is not one) becomes an `Unavailable`
whose message every builder shows, so a traceback never reaches the page. `cpu_mem_gb`
(host RAM per machine) lets a strategy fit only when loading and offloading fit in RAM.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go

from tunedeck.backend.advisor import (
    FIT_FRACTION,
    Advice,
    StrategyEstimate,
    advise,
    format_gb,
    gpu_memory_gb,
    limit_sentence,
)
from tunedeck.backend.memory import TERMS, estimate
from tunedeck.backend.memory_job import EstimateError
from tunedeck.backend.memory_load import LOAD_TERMS
from tunedeck.backend.spec import JobSpec, SpecError, parse_spec
from tunedeck.backend.speed import Hardware, dataset_rows, hardware_for, schedule_of

HEADERS = [
    "Strategy", "Per GPU (GB)", "Load (GB)", "Train (GB)", "Peak in", "Fits",
    "CPU RAM per machine (GB)", "NVMe per machine (GB)", "Largest term",
]  # fmt: skip
# The predicted speed of each strategy (backend/speed.py), after the memory columns.
SPEED_HEADERS = ["Step (s)", "Tokens/s per GPU", "Hours", "Cost"]

# One color per memory term, the same in every bar.
TERM_COLORS = {
    "weights": "#4f46e5",
    "gradients": "#0891b2",
    "optimizer": "#059669",
    "adapter": "#65a30d",
    "activations": "#ea580c",
    "logits": "#d97706",
    "gathered": "#db2777",
    "buckets": "#9333ea",
    "cuda_context": "#64748b",
    "allocator": "#94a3b8",
}
LOAD_MARKER = "Load phase"


@dataclass(frozen=True)
class Unavailable:
    """Why there is no estimate: markdown for the recommendation box, plain text for the chart."""

    markdown: str
    text: str


def compute_advice(
    spec: JobSpec, gpu_mem_gb: float | str, cpu_mem_gb: float | None = None, hardware: Hardware | None = None
) -> Advice | Unavailable:
    """The advice for this job on this GPU, or why there is none; with the speed predicted on the GPU
    the box names (or on the assumed one, which the advice says)."""
    try:
        hardware = hardware or hardware_for(gpu_mem_gb)
        schedule = schedule_of(spec, *dataset_rows(spec))
        return advise(spec, gpu_memory_gb(gpu_mem_gb), cpu_mem_gb=cpu_mem_gb, hardware=hardware, schedule=schedule)
    except EstimateError as exc:
        return Unavailable(f"**Memory estimate unavailable** ({exc.field}): {escape(str(exc))}.", str(exc))
    except ValueError as exc:
        return Unavailable(f"**GPU memory**: {escape(str(exc))}.", str(exc))


def estimate_table(advice: Advice | Unavailable) -> tuple[list[str], list[list]]:
    """(headers, rows): one row per strategy, fastest first; the current one and the advice marked."""
    if isinstance(advice, Unavailable):
        return HEADERS + SPEED_HEADERS, []
    rows = []
    for o in advice.options:
        e = o.estimate
        phases = e.phases
        terms, values = (LOAD_TERMS, e.load_breakdown) if e.limiting_phase == "load" else (TERMS, e.breakdown)
        largest = max(terms, key=lambda k: values[k])
        rows.append(
            [
                _label(o, advice.recommendation.strategy),
                round(e.per_gpu_gb, 2),
                round(phases["load"], 2),
                round(phases["train"], 2),
                "loading" if e.limiting_phase == "load" else "training",
                "yes" if o.fits else "no",
                round(e.host_gb, 1),
                round(e.nvme_gb, 1),
                terms[largest],
                *_speed_cells(o),
            ]
        )
    return HEADERS + SPEED_HEADERS, rows


def _speed_cells(option: StrategyEstimate) -> list:
    """Step time, tokens/s per GPU, hours and cost; "" where nothing is predicted (a CPU job, no price)."""
    s = option.speed
    if s is None:
        return ["", "", "", ""]
    return [
        round(s.step_time_s, 2),
        round(s.tokens_per_s_per_gpu),
        "" if s.hours is None else round(s.hours, 2),
        "" if s.cost is None else round(s.cost, 2),
    ]


def estimate_figure(advice: Advice | Unavailable) -> go.Figure:
    """One stacked bar per strategy (a segment per training term), a marker at each strategy's
    load phase, and lines at the GPU's capacity and the fit threshold."""
    fig = go.Figure()
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        margin=dict(l=50, r=20, t=40, b=110),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
        yaxis_title="GB per GPU",
        uirevision="keep",
    )
    if isinstance(advice, Unavailable):
        # Plotly draws annotation text as (limited) HTML: keep the message's words, not its markup.
        text = advice.text.replace("<", "‹").replace(">", "›")
        fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    options, gb = advice.options, advice.gpu_mem_gb
    labels = [_label(o, advice.recommendation.strategy) for o in options]
    for key, name in TERMS.items():
        values = [o.estimate.breakdown[key] for o in options]
        if not any(values):
            continue
        fig.add_bar(
            name=name,
            x=labels,
            y=values,
            marker_color=TERM_COLORS[key],
            hovertemplate=f"%{{x}}<br>{name} (training): %{{y:.2f}} GB<extra></extra>",
        )
    fig.add_scatter(
        name=LOAD_MARKER,
        x=labels,
        y=[o.estimate.phases["load"] for o in options],
        mode="markers",
        marker=dict(symbol="line-ew", size=36, line=dict(width=4, color="#111827")),
        hovertemplate="%{x}<br>while loading: %{y:.2f} GB<extra></extra>",
    )
    fig.add_hline(
        y=gb, line_color="#dc2626", line_width=2, annotation_text=f"GPU {gb:g} GB", annotation_position="top left"
    )
    fig.add_hline(
        y=FIT_FRACTION * gb,
        line_color="#dc2626",
        line_dash="dot",
        line_width=1,
        annotation_text=f"fits below {FIT_FRACTION:.0%}",
        annotation_position="bottom left",
    )
    fig.update_xaxes(tickangle=-30)
    return fig


def recommendation_markdown(advice: Advice | Unavailable) -> str:
    """The advice in one paragraph: what to use, why, which phase limits, and the fields it changes."""
    if isinstance(advice, Unavailable):
        return advice.markdown
    current, gb, rec = advice.current, advice.gpu_mem_gb, advice.recommendation
    phases = current.phases
    lines = [
        f"This job as set: **{format_gb(current.per_gpu_gb)} per GPU** of {gb:g} GB "
        f"({format_gb(phases['load'])} to load, {format_gb(phases['train'])} to train)"
    ]
    if current.host_gb >= 0.5 or current.nvme_gb:
        lines[0] += (
            f"; CPU RAM per machine: {current.load_cpu_gb:.0f} GB while loading, {current.cpu_gb:.0f} GB while training"
        )
        if current.nvme_gb:
            lines[0] += f", and {current.nvme_gb:.0f} GB NVMe"
    lines[0] += "."
    limit = limit_sentence(current, gb)
    if limit:
        lines.append(f"**Loading sets the peak:** {escape(limit)}.")
    if rec.strategy is None:
        lines.append(f"**Nothing fits.** {escape(rec.reason)}")
    elif rec.changes:
        lines.append(f"**Recommended: {rec.strategy}.** {escape(rec.reason)}")
        lines.append("Changes: " + ", ".join(f"`{k}` → `{_value(v)}`" for k, v in rec.changes.items()))
    else:
        lines.append(f"**Keep {rec.strategy}.** {escape(rec.reason)}")
    speed = _speed_markdown(advice)
    if speed:
        lines.append(speed)
    return "\n\n".join(lines)


def _speed_markdown(advice: Advice) -> str:
    """The job as set: predicted speed and time, on which GPU, and how the steps were counted."""
    s, hw = advice.current_speed, advice.hardware
    if hw is None:
        return ""
    if s is None:
        return "**Speed:** not predicted (a CPU job, or no known peak for the GPU)."
    gpu = f"{hw.gpu} (assumed: type your GPU's name in the GPU box)" if hw.source == "assumed" else hw.gpu
    text = f"**Speed on {escape(gpu, quote=False)}:** {s.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {s.step_time_s:.2f} s per step"
    if s.hours is not None:
        text += f", about {s.hours:.1f} h to finish ({escape(s.steps_source, quote=False)})"
    return text + "."


def measured_markdown(job: JobSpec | dict, peaks: dict[str, list[float]]) -> str:
    """A run's measured peak per rank (GB, from metrics.jsonl) beside the prediction for its job."""
    try:
        spec = job if isinstance(job, JobSpec) else parse_spec(job)
        est = estimate(spec)
    except (SpecError, EstimateError) as exc:
        return f"(memory estimate unavailable: {escape(str(exc))})"
    predicted = {"allocated": est.allocated_gb, "reserved": est.reserved_gb}
    lines = [
        f"**Predicted per GPU:** {format_gb(est.allocated_gb)} allocated, {format_gb(est.reserved_gb)} reserved, "
        f"{format_gb(est.per_gpu_gb)} with the CUDA context "
        f"(peak while {'loading' if est.limiting_phase == 'load' else 'training'})"
    ]
    for kind in ("allocated", "reserved"):
        values = peaks.get(kind) or []
        if values:
            ranks = ", ".join(
                f"rank {i}: {format_gb(v)} ({(v - predicted[kind]) / predicted[kind]:+.0%})"
                for i, v in enumerate(values)
            )
            lines.append(f"**Measured peak {kind}:** {ranks}")
    if len(lines) == 1:
        lines.append("No GPU peaks measured (a CPU run, or no step logged yet).")
    return "\n\n".join(lines)


def _label(option: StrategyEstimate, chosen: str | None) -> str:
    marks = []
    if option.current:
        marks.append("current")
    if option.strategy == chosen:
        marks.append("★ recommended")
    return option.strategy + (f" ({', '.join(marks)})" if marks else "")


def _value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
