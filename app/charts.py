"""Plotly figures of a run's metrics: loss (with EMA smoothing, eval loss, overlay), lr, grad norm, tokens/s, MFU,
and for a DPO or KTO run its rewards.

Figures are built from a run's log records (backend/run_folder.py's LogRecord), downsampled
to at most MAX_POINTS per series, so a week-long run draws as fast as a demo.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunedeck.backend.run_folder import LogRecord, is_number

MAX_POINTS = 2000
# The small charts beside the loss: (LogRecord field, title).
METRIC_PANELS = (
    ("learning_rate", "learning rate"), ("grad_norm", "grad norm"), ("tokens_per_second", "tokens / s"), ("mfu", "MFU"),
)  # fmt: skip
# A DPO or KTO run's second row: (LogRecord fields, title); each with its eval_ twin as markers when the run
# evaluates. Told apart by what only each logs: DPO how often chosen wins, KTO its KL estimate.
PREFERENCE_PANELS = {
    "reward_accuracy": (
        (("reward_accuracy",), "pairs where chosen wins"),
        (("reward_margin",), "reward margin (chosen - rejected)"),
        (("reward_chosen", "reward_rejected"), "rewards: chosen (blue), rejected (orange)"),
    ),
    "kl": (
        (("reward_margin",), "reward margin (good - bad)"),
        (("reward_chosen", "reward_rejected"), "rewards: good (blue), bad (orange)"),
        (("kl",), "KL estimate (model vs reference)"),
    ),
}
NO_MFU = "MFU is not defined here:<br>no known peak throughput<br>(a CPU run, or a GPU not in<br>the table of peaks)"
COLORS = ("#4f46e5", "#ea580c")  # shown run, overlaid run
_LAYOUT = dict(
    margin=dict(l=50, r=20, t=40, b=40),
    template="plotly_white",
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
    uirevision="keep",  # keep the user's zoom across updates
)


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list, list]:
    """At most max_points (x, y) pairs: an even stride over the series, always keeping the last point."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    stride = math.ceil(n / (max_points - 1))
    idx = list(range(0, n - 1, stride)) + [n - 1]
    return [xs[i] for i in idx], [ys[i] for i in idx]


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with the start-up bias removed (as TensorBoard's smoothing)."""
    out, last, debias = [], 0.0, 1.0
    for v in values:
        last = last * weight + (1 - weight) * v
        debias *= weight
        out.append(last / (1 - debias) if debias < 1 else v)
    return out


def series(records: Sequence[LogRecord], key: str) -> tuple[list, list]:
    """(steps, values) of the records that carry a finite number under `key`."""
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if is_number(value) and math.isfinite(value) and r.get("step") is not None:
            xs.append(r["step"])
            ys.append(value)
    return xs, ys


NO_STEP_YET = "No training step logged yet: the loss appears here after the first logging step."


def loss_figure(
    runs: Sequence[tuple[str, Sequence[LogRecord]]], smoothing: float = 0.6, log_scale: bool = False
) -> go.Figure:
    """Loss per step for one run, or two overlaid: raw (faint), EMA-smoothed (bold), eval loss (markers); a note
    in place of empty axes (plotly's default frame reads -1..6) while no loss has been logged."""
    if not any(series(records, key)[0] for _, records in runs for key in ("loss", "eval_loss")):
        return waiting_figure(NO_STEP_YET)
    data = []
    for (label, records), color in zip(runs, COLORS):
        steps, loss = series(records, "loss")
        if steps:
            x, y = downsample(steps, loss)
            data.append(_line(x, y, f"{label} loss", dict(color=color, width=1), opacity=0.3))
            if smoothing > 0:
                x, y = downsample(steps, ema(loss, smoothing))
                data.append(_line(x, y, f"{label} smoothed", dict(color=color, width=2.5)))
        steps, eval_loss = series(records, "eval_loss")
        if steps:
            x, y = downsample(steps, eval_loss)
            data.append(_line(x, y, f"{label} eval loss", dict(color=color, dash="dot"), mode="lines+markers",
                              marker=dict(size=7)))  # fmt: skip
    return _figure(data, copy.deepcopy(_validated_loss_layout(log_scale)))


def metrics_figure(records: Sequence[LogRecord]) -> go.Figure:
    """Learning rate, gradient norm, throughput and MFU (model FLOPs utilisation) side by side; below them
    a DPO or KTO run's rewards (PREFERENCE_PANELS)."""
    logged = {key for r in records for key in r}
    preference = next((key for key in PREFERENCE_PANELS if {key, f"eval_{key}"} & logged), None)
    layout, data = copy.deepcopy(_validated_metrics_layout(preference)), []
    for col, (key, title) in enumerate(METRIC_PANELS, start=1):
        x, y = downsample(*series(records, key))
        axis = "" if col == 1 else str(col)
        if key == "mfu" and records and not y:  # train.py logs none without a known peak: say so, draw no axes
            layout["annotations"].append(dict(text=NO_MFU, showarrow=False, x=0.5, y=0.5, xref=f"x{axis} domain",
                                              yref=f"y{axis} domain", font=dict(color="#64748b")))  # fmt: skip
            for name in (f"xaxis{axis}", f"yaxis{axis}"):
                layout[name] = {**layout[name], "visible": False}
        data.append(_line(x, y, title, dict(color=COLORS[0]), showlegend=False, xaxis=f"x{axis}", yaxis=f"y{axis}"))
    if preference:
        for panel, (keys, _) in enumerate(PREFERENCE_PANELS[preference], start=len(METRIC_PANELS) + 1):
            axes = dict(showlegend=False, xaxis=f"x{panel}", yaxis=f"y{panel}")
            for key, color in zip(keys, COLORS):
                name = key.replace("_", " ")
                data.append(_line(*downsample(*series(records, key)), name, dict(color=color), **axes))
                x, y = downsample(*series(records, f"eval_{key}"))
                if x:
                    data.append(_line(x, y, f"eval {name}", dict(color=color, dash="dot"), mode="lines+markers",
                                      marker=dict(size=6), **axes))  # fmt: skip
    return _figure(data, layout)


# A live run's charts are redrawn every few seconds: Plotly's validation of every trace and layout
# property took ~110 ms of the panel's CPU per redraw. The layouts are built and validated once;
# a redraw copies one and adds plain trace dicts of known-good keys (tests/panel check they validate).
def _line(x: list, y: list, name: str, line: dict, mode: str = "lines", **more) -> dict:
    return dict(type="scatter", x=x, y=y, mode=mode, name=name, line=line, **more)


def _figure(data: list[dict], layout: dict) -> go.Figure:
    return go.Figure(dict(data=data, layout=layout), _validate=False)


@functools.cache
def _validated_loss_layout(log_scale: bool) -> dict:
    fig = go.Figure()
    fig.update_layout(title="Loss", xaxis_title="step", height=340, **_LAYOUT)
    fig.update_yaxes(type="log" if log_scale else "linear")
    return fig.to_plotly_json()["layout"]


@functools.cache
def _validated_metrics_layout(preference: str | None = None) -> dict:
    below = PREFERENCE_PANELS[preference] if preference else ()
    cols, rows = len(METRIC_PANELS), 2 if below else 1
    titles = [t for _, t in METRIC_PANELS] + [t for _, t in below]
    specs = [[{}] * cols] + ([[{}] * len(below) + [None] * (cols - len(below))] * (rows - 1))
    fig = make_subplots(
        rows=rows, cols=cols, specs=specs, subplot_titles=titles, horizontal_spacing=0.07, vertical_spacing=0.25
    )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(rangemode="tozero", row=1)  # a constant lr of 5e-3 must not read as 0
    fig.update_yaxes(exponentformat="e", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", row=1, col=cols)  # MFU is a share of the GPU's peak
    if preference == "reward_accuracy":  # rewards and margins go below 0; the share of pairs won is 0-100%
        fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=2, col=1)
    fig.update_layout(height=260 * rows, **{**_LAYOUT, "margin": dict(l=50, r=20, t=30, b=40)})
    return fig.to_plotly_json()["layout"]


def waiting_figure(text: str, height: int = 340) -> go.Figure:
    """A chart's place before it has data: the text alone, no empty axes (plotly's default frame reads -1..6)."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=15))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, **{**_LAYOUT, "margin": dict(l=20, r=20, t=20, b=20)})
    return fig
