"""Pure builders of the panel's memory view: the strategy table, the stacked bar chart, the
recommendation and the measured-vs-predicted line of a run.

No Gradio here: the page calls these on every form change (one estimate takes well under a
millisecond). Every builder turns an estimate error (an unknown model) into a message, so a
traceback never reaches the page. `cpu_mem_gb` (host RAM per machine, e.g. from psutil)
lets offloading strategies fit only when the offloaded states fit in RAM.
"""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from backend.estimate import (
    FIT_FRACTION,
    TERMS,
    EstimateError,
    StrategyEstimate,
    compare_strategies,
    estimate,
    format_gb,
    gpu_memory_gb,
    recommend,
)
from backend.spec import JobSpec, SpecError, parse_spec

HEADERS = ["Strategy", "Per GPU (GB)", "Fits", "CPU RAM per machine (GB)", "NVMe per machine (GB)", "Largest term"]

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


def estimate_table(
    spec: JobSpec, gpu_mem_gb: float | str, cpu_mem_gb: float | None = None
) -> tuple[list[str], list[list]]:
    """(headers, rows): one row per strategy, fastest first; the current one and the advice marked."""
    try:
        gb = gpu_memory_gb(gpu_mem_gb)
        options = compare_strategies(spec, gb, cpu_mem_gb=cpu_mem_gb)
        chosen = recommend(spec, gb, cpu_mem_gb=cpu_mem_gb).strategy
    except (EstimateError, ValueError):
        return HEADERS, []
    rows = []
    for o in options:
        e = o.estimate
        largest = max(TERMS, key=lambda k: e.breakdown[k])
        rows.append(
            [
                _label(o, chosen),
                round(e.per_gpu_gb, 2),
                "yes" if o.fits else "no",
                round(e.cpu_gb, 1),
                round(e.nvme_gb, 1),
                TERMS[largest],
            ]
        )
    return HEADERS, rows


def estimate_figure(spec: JobSpec, gpu_mem_gb: float | str, cpu_mem_gb: float | None = None) -> go.Figure:
    """One stacked bar per strategy (a segment per memory term) and a line at the GPU's capacity."""
    fig = go.Figure()
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        margin=dict(l=50, r=20, t=40, b=110),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
        yaxis_title="GB per GPU",
        uirevision="keep",
    )
    try:
        gb = gpu_memory_gb(gpu_mem_gb)
        options = compare_strategies(spec, gb, cpu_mem_gb=cpu_mem_gb)
        chosen = recommend(spec, gb, cpu_mem_gb=cpu_mem_gb).strategy
    except (EstimateError, ValueError) as exc:
        # Plotly draws annotation text as (limited) HTML: keep the message's words, not its markup.
        text = str(exc).replace("<", "‹").replace(">", "›")
        fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    labels = [_label(o, chosen) for o in options]
    for key, name in TERMS.items():
        values = [o.estimate.breakdown[key] for o in options]
        if not any(values):
            continue
        fig.add_bar(
            name=name,
            x=labels,
            y=values,
            marker_color=TERM_COLORS[key],
            hovertemplate=f"%{{x}}<br>{name}: %{{y:.2f}} GB<extra></extra>",
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


def recommendation_markdown(spec: JobSpec, gpu_mem_gb: float | str, cpu_mem_gb: float | None = None) -> str:
    """The advice in one paragraph: what to use, why, and the fields it changes."""
    try:
        gb = gpu_memory_gb(gpu_mem_gb)
        current = estimate(spec)
        advice = recommend(spec, gb, cpu_mem_gb=cpu_mem_gb)
    except EstimateError as exc:
        return f"**Memory estimate unavailable** ({exc.field}): {escape(str(exc))}."
    except ValueError as exc:
        return f"**GPU memory**: {escape(str(exc))}."
    lines = [f"This job as set: **{format_gb(current.per_gpu_gb)} per GPU** of {gb:g} GB"]
    if current.cpu_gb or current.nvme_gb:
        lines[0] += f", {current.cpu_gb:.0f} GB CPU RAM and {current.nvme_gb:.0f} GB NVMe per machine"
    lines[0] += "."
    if advice.strategy is None:
        lines.append(f"**Nothing fits.** {escape(advice.reason)}")
    elif advice.changes:
        lines.append(f"**Recommended: {advice.strategy}.** {escape(advice.reason)}")
        lines.append("Changes: " + ", ".join(f"`{k}` → `{_value(v)}`" for k, v in advice.changes.items()))
    else:
        lines.append(f"**Keep {advice.strategy}.** {escape(advice.reason)}")
    return "\n\n".join(lines)


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
        f"{format_gb(est.per_gpu_gb)} with the CUDA context"
    ]
    for kind in ("allocated", "reserved"):
        values = peaks.get(kind) or []
        if values:
            ranks = ", ".join(
                f"rank {i}: {format_gb(v)} ({(v - predicted[kind]) / predicted[kind]:+.0%})" for i, v in enumerate(values)
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
