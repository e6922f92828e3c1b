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

import plotly.graph_objects as go

from tunedeck.app.untrusted_text import as_html, as_text
from tunedeck.backend.estimate import (
    FIT_FRACTION,
    LOAD_TERMS,
    TERMS,
    Advice,
    EstimateError,
    Hardware,
    StrategyEstimate,
    advise,
    dataset_rows,
    estimate,
    format_gb,
    gpu_memory_gb,
    hardware_for,
    limit_sentence,
    schedule_of,
)
from tunedeck.backend.spec import JobSpec, SpecError, parse_spec, shown

HEADERS = [
    "Strategy", "GB per GPU", "Load GB", "Train GB", "Peak in", "Fits",
    "Host RAM GB", "NVMe GB", "Largest term", "Speed",
]  # fmt: skip
# Under the table: why the rows are in this order, and what the Speed column means.
ORDER_NOTE = (
    "Rows from the least memory per GPU to the most. **Speed** ranks the predicted time per token, 1 = fastest "
    "(without a prediction, the guides' order: no sharding, then weight sharding, then offload, then 4-bit); "
    "the recommendation is the fastest that fits."
)
# The predicted speed of each strategy (backend/estimate/speed.py), after the memory columns; Cost only once a price is given.
SPEED_HEADERS = ["Step s", "Tok/s/GPU", "Hours", "Cost"]  # short: the table must read at 1280 px
COST = "Cost"
# The width of each column but the first; the Strategy column takes what they leave of 100%, so the table
# fills its width with or without the Cost column and headers wrap at most at their words.
WIDTHS = {
    "GB per GPU": 7,
    "Load GB": 6,
    "Train GB": 6,
    "Peak in": 7,
    "Fits": 5,
    "Host RAM GB": 7,
    "NVMe GB": 6,
    "Largest term": 11,
    "Speed": 5,
    "Step s": 6,
    "Tok/s/GPU": 8,
    "Hours": 5,
    COST: 5,
}
# What a price box takes (the bound `tunedeck estimate --price-per-gpu-hour` checks too).
PRICE_MAX = 1e6


def table_headers(priced: bool) -> list[str]:
    """The table's columns: Cost only when a price per GPU-hour is given."""
    return HEADERS + [h for h in SPEED_HEADERS if priced or h != COST]


def column_widths(headers: list[str]) -> list[str | int]:
    """One width per column of `headers`, summing to 100%."""
    rest = [WIDTHS[h] for h in headers[1:]]
    return [f"{100 - sum(rest)}%", *(f"{w}%" for w in rest)]


# One color per memory term, the same in every bar.
TERM_COLORS = {
    "weights": "#4f46e5",
    "gradients": "#0891b2",
    "optimizer": "#059669",
    "adapter": "#65a30d",
    "reference": "#0d9488",
    "activations": "#ea580c",
    "logits": "#d97706",
    "gathered": "#db2777",
    "generation": "#be123c",
    "generation_gathered": "#f472b6",
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
    spec: JobSpec,
    gpu_mem_gb: float | str,
    cpu_mem_gb: float | str | None = None,
    hardware: Hardware | None = None,
    seq_len: int | None = None,
    correction: float = 1.0,
    lengths: dict | None = None,  # the preview's length stats of this job's data: padding
) -> Advice | Unavailable:
    """The advice for this job on this GPU (and host RAM: GB, a box's text, or None for not checked), or why
    there is none; with the speed predicted on the GPU the box names (or on the assumed one, which the advice says),
    times `correction` (your runs' measured over predicted throughput, when the page applies it)."""
    try:
        gpu = gpu_memory_gb(gpu_mem_gb)
    except ValueError as exc:
        return Unavailable(f"**GPU memory**: {as_text(exc)}.", str(exc))
    try:
        ram = parse_ram(cpu_mem_gb) if isinstance(cpu_mem_gb, str) else cpu_mem_gb
        hardware = hardware or hardware_for(gpu_mem_gb)
        schedule = schedule_of(spec, *dataset_rows(spec), lengths=lengths)
        return advise(
            spec, gpu, cpu_mem_gb=ram, hardware=hardware, schedule=schedule, seq_len=seq_len, correction=correction
        )
    except EstimateError as exc:
        return Unavailable(f"**Memory estimate unavailable** ({as_text(exc.field)}): {as_text(exc)}.", str(exc))
    except ValueError as exc:
        return Unavailable(f"**Host RAM**: {as_text(exc)}.", str(exc))


def parse_ram(text: str | None) -> float | None:
    """The RAM box: GB, or empty for "not checked". Raises ValueError saying what is accepted."""
    text = (text or "").strip().upper().removesuffix("GB").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number: give the RAM of one machine in GB, e.g. 256") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{value:g} GB: give the RAM of one machine in GB, e.g. 256")
    return value


def parse_price(text: str | None) -> float | None:
    """The price box: the price of one GPU-hour (a currency sign before it is dropped), or empty for none.
    Raises ValueError saying what is accepted."""
    text = (text or "").strip()
    if not text:
        return None
    typed = f"'{shown(text, 40)}'"  # as typed, control characters escaped, a long paste cut
    try:
        value = float(text.lstrip("$€£¥ "))
    except ValueError:
        raise ValueError(f"{typed} is not a number: give the price of one GPU-hour, e.g. 2.5, or empty it") from None
    if value < 0:
        raise ValueError(f"{value:g} is negative: give the price of one GPU-hour, e.g. 2.5, or empty it")
    if not value < PRICE_MAX:  # also inf and nan
        raise ValueError(f"{typed} is not the price of one GPU-hour: give one below {PRICE_MAX:,.0f}, e.g. 2.5")
    return value


def by_memory(advice: Advice) -> list[tuple[int, StrategyEstimate]]:
    """(speed rank, 1 = fastest; option) from the least memory per GPU to the most."""
    inf = float("inf")
    fastest_first = sorted(advice.options, key=lambda o: o.speed.pace if o.speed is not None else inf)
    ranked = [(rank, o) for rank, o in enumerate(fastest_first, start=1)]  # sorted() keeps the guides' order on ties
    return sorted(ranked, key=lambda item: (item[1].estimate.per_gpu_gb, item[0]))


def estimate_table(advice: Advice | Unavailable) -> tuple[list[str], list[list]]:
    """(headers, rows): one row per strategy, by memory; the current one and the advice marked; a Cost column
    when the advice was priced (a price per GPU-hour given)."""
    if isinstance(advice, Unavailable):
        return table_headers(False), []
    priced = advice.hardware is not None and advice.hardware.price_per_gpu_hour is not None
    rows = []
    for rank, o in by_memory(advice):
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
                rank,
                *_speed_cells(o)[: 4 if priced else 3],
            ]
        )
    return table_headers(priced), rows


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


def option_choices(advice: Advice | Unavailable) -> list[tuple[str, str]]:
    """(label, strategy) of each option for the "apply a strategy" picker, in the table's order."""
    if isinstance(advice, Unavailable):
        return []
    return [(_label(o, advice.recommendation.strategy), o.strategy) for _, o in by_memory(advice)]


def option_changes(advice: Advice, strategy: str, values: dict) -> dict:
    """The fields that turn the job into `strategy`'s option: only those that differ from `values`."""
    option = next((o for o in advice.options if o.strategy == strategy), None)
    if option is None:
        raise ValueError(f"{strategy!r} is not an option for this job any more: pick one from the list again")
    return {k: v for k, v in option.changes.items() if values.get(k) != v}


def estimate_figure(advice: Advice | Unavailable) -> go.Figure:
    """One horizontal stacked bar per strategy (a segment per training term; labels on the left, so they
    never overlap a bar), a marker at each strategy's load phase, and lines at the GPU's capacity and
    the fit threshold. Bars in the table's order, least memory on top."""
    fig = go.Figure()
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        margin=dict(l=10, r=20, t=60, b=40),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        xaxis_title="GB per GPU",
        uirevision="keep",
    )
    if isinstance(advice, Unavailable):
        # Plotly draws annotation text as (limited) HTML: keep the message's words, not its markup.
        fig.add_annotation(text=as_html(advice.text), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    options, gb = [o for _, o in by_memory(advice)], advice.gpu_mem_gb
    labels = [_label(o, advice.recommendation.strategy) for o in options]
    for key, name in TERMS.items():
        values = [o.estimate.breakdown[key] for o in options]
        if not any(values):
            continue
        fig.add_bar(
            name=name,
            y=labels,
            x=values,
            orientation="h",
            marker_color=TERM_COLORS[key],
            hovertemplate=f"%{{y}}<br>{name} (training): %{{x:.2f}} GB<extra></extra>",
        )
    fig.add_scatter(
        name=LOAD_MARKER,
        y=labels,
        x=[o.estimate.phases["load"] for o in options],
        mode="markers",
        marker=dict(symbol="line-ns", size=22, line=dict(width=4, color="#111827")),
        hovertemplate="%{y}<br>while loading: %{x:.2f} GB<extra></extra>",
    )
    fig.add_vline(x=gb, line_color="#dc2626", line_width=2, annotation_text=f"GPU {gb:g} GB", annotation_position="top")
    fig.add_vline(
        x=FIT_FRACTION * gb,
        line_color="#dc2626",
        line_dash="dot",
        line_width=1,
        annotation_text=f"fits below {FIT_FRACTION:.0%}",
        annotation_position="bottom left",
    )
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_layout(height=140 + 32 * len(options))
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
    if current.save.host_gb >= 0.5:  # a save can fail where training fits (backend/estimate/memory_save.py)
        lines.append(
            f"**Saving** adds {format_gb(current.save.host_gb)} of host RAM per machine "
            f"({format_gb(current.save_host_gb)} while it saves): {as_text(current.save.how)}."
        )
    limit = limit_sentence(current, gb)
    if limit:
        lines.append(f"**Loading sets the peak:** {as_text(limit)}.")
    if rec.strategy is None:
        lines.append(f"**Nothing fits.** {as_text(rec.reason)}")
    elif rec.changes:
        lines.append(f"**Recommended: {rec.strategy}.** {as_text(rec.reason)}")
        lines.append("Changes: " + ", ".join(f"`{k}` → `{_value(v)}`" for k, v in rec.changes.items()))
    else:
        lines.append(f"**Keep {rec.strategy}.** {as_text(rec.reason)}")
    speed = _speed_markdown(advice)
    if speed:
        lines.append(speed)
    return "\n\n".join(lines)


def _speed_markdown(advice: Advice) -> str:
    """The job as set: predicted speed and time, on which GPU, how the steps were counted, and its cost at the
    price given."""
    s, hw = advice.current_speed, advice.hardware
    if hw is None:
        return ""
    if s is None:
        return "**Speed:** not predicted (a CPU job, or no known peak for the GPU)."
    gpu = f"{hw.gpu} (assumed: type your GPU's name in the GPU box)" if hw.source == "assumed" else hw.gpu
    text = f"**Speed on {as_text(gpu)}:** {s.tokens_per_s_per_gpu:,.0f} tokens/s per GPU trained"
    text += f" ({as_text(s.data_sentence)}), {s.step_time_s:.2f} s per step"  # useful tokens, not padding
    if s.hours is not None:
        text += f", about {s.hours:.1f} h to finish ({as_text(s.steps_source)})"
    price = hw.price_per_gpu_hour
    if price is not None and s.cost is not None:
        # The cost is hours x price x every GPU.
        gpus = round(s.cost / (s.hours * price)) if s.cost and s.hours else None
        every = f" × {gpus} GPUs" if gpus and gpus > 1 else ""
        text += f"; **about {s.cost:,.2f} in all** at {price:g} per GPU-hour{every}"
    elif price is not None:
        text += f"; no cost at {price:g} per GPU-hour without the number of steps (set `training.max_steps`)"
    return text + "."


def measured_markdown(job: JobSpec | dict, peaks: dict[str, list[float]]) -> str:
    """A run's measured peak per rank (GB, from metrics.jsonl) beside the prediction for its job."""
    try:
        spec = job if isinstance(job, JobSpec) else parse_spec(job)
        est = estimate(spec)
    except (SpecError, EstimateError) as exc:
        return f"(memory estimate unavailable: {as_text(exc)})"
    predicted = {"allocated": est.allocated_gb, "reserved": est.reserved_gb}
    if spec.launch.use_cpu:
        return (
            f"**A CPU run:** no GPU memory to measure. On GPUs this job would need about {format_gb(est.per_gpu_gb)} "
            "per GPU (the Job tab's estimate)."
        )
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
        lines.append("No GPU peaks measured yet: they come with the first logging step.")
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
