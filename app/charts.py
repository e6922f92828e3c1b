"""Plotly figures of a run's metrics: loss (with EMA smoothing, eval loss, overlay), lr, grad norm, tokens/s, MFU,
for a DPO or KTO run its rewards, and for a GRPO run its reward above the loss and its answers below the metrics.

Figures are built from a run's log records (backend/runs/folder.py's LogRecord), downsampled
to at most MAX_POINTS per series, so a week-long run draws as fast as a demo.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tunedeck.app.chart_marks import with_marks
from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.recipe import GENERAL_TEXT_LOSS, OBJECTIVES
from tunedeck.backend.runs import LogRecord, is_number

MAX_POINTS = 2000
# The small charts beside the loss: (LogRecord field, title).
METRIC_PANELS = (
    ("learning_rate", "learning rate"), ("grad_norm", "grad norm"), ("tokens_per_second", "tokens / s"), ("mfu", "MFU"),
)  # fmt: skip
# A preference run's second row by its objective's chart family (backend/recipe/objectives_table.py): (LogRecord
# fields, title); each with its eval_ twin as markers when the run evaluates.
PREFERENCE_PANELS = {
    "pairs": (
        (("reward_accuracy",), "pairs where chosen wins"),
        (("reward_margin",), "reward margin (chosen - rejected)"),
        (("reward_chosen", "reward_rejected"), "rewards: chosen (blue), rejected (orange)"),
    ),
    "unpaired": (
        (("reward_margin",), "reward margin (good - bad)"),
        (("reward_chosen", "reward_rejected"), "rewards: good (blue), bad (orange)"),
        (("kl",), "KL estimate (model vs reference)"),
    ),
    "odds": (  # ORPO: the chosen answer's NLL, and how much likelier the model finds it than the rejected one
        (("reward_accuracy",), "pairs where chosen wins"),
        (("log_odds_ratio",), "log odds ratio (chosen vs rejected)"),
        (("nll_loss",), "NLL loss of the chosen answers"),
    ),
}
# A GRPO run's second row (the answers it wrote), chosen by what only GRPO logs; its KL when grpo.beta > 0.
GRPO_PANELS = (
    (("completion_length",), "answers: mean length (tokens)"),
    (("completions_clipped", "groups_without_signal"), "answers cut at max length (blue),<br>prompts all scored alike (orange)"),
    (("reward_std",), "reward spread (std of the answers)"),
)  # fmt: skip
GRPO_KL_PANEL = (("kl",), "KL estimate (model vs reference)")
SHARES = ("completions_clipped", "groups_without_signal")  # 0-1, drawn as %
# Each reward's mean (a GRPO record's "rewards": {name: mean}): one color each, after the summed reward's.
REWARD_COLORS = ("#16a34a", "#db2777", "#0891b2", "#ca8a04", "#7c3aed", "#dc2626", "#65a30d", "#0d9488")
NO_MFU = "MFU is not defined here:<br>no known peak throughput<br>(a CPU run, or a GPU not in<br>the table of peaks)"
COLORS = ("#4f46e5", "#ea580c")  # shown run, overlaid run
# A resumed run's forebears (backend/runs/lineage.py), before its own curve: the shown run's hue, lighter.
BEFORE, BEFORE_COLOR = "before resume", "#a5b4fc"
_LAYOUT: dict[str, Any] = dict(  # Plotly layout keywords of every chart
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
        if is_number(value) and math.isfinite(value) and "step" in r:
            xs.append(r["step"])
            ys.append(value)
    return xs, ys


NO_STEP_YET = "No training step logged yet: the loss appears here after the first logging step."


def reward_series(records: Sequence[LogRecord], name: str, prefix: str = "") -> tuple[list, list]:
    """(steps, values) of one reward's mean: a GRPO record's `rewards` (`eval_rewards`) dict, under `name`."""
    xs, ys = [], []
    for r in records:
        value = (r.get(f"{prefix}rewards") or {}).get(name)
        if is_number(value) and math.isfinite(value) and "step" in r:
            xs.append(r["step"])
            ys.append(value)
    return xs, ys


def is_grpo(records: Sequence[LogRecord]) -> bool:
    """A GRPO run's records: they carry the answers' reward (DPO's and KTO's rewards have other names)."""
    return any(key in r for r in records for key in ("reward", "eval_reward"))


def loss_figure(
    runs: Sequence[tuple[str, Sequence[LogRecord]]],
    smoothing: float = 0.6,
    log_scale: bool = False,
    before: Sequence[LogRecord] = (),
    marks: Sequence[tuple[int, str]] = (),
) -> go.Figure:
    """Loss per step for one run, or two overlaid: raw (faint), EMA-smoothed (bold), eval loss (markers); a resumed
    run's forebears' loss (`before`) lighter before it; `marks` (health_marks: a roll-back, a symptom) as dashed
    lines at their steps; a note in place of empty axes (plotly's default frame reads -1..6) while no loss has been
    logged."""
    if not any(series(records, key)[0] for _, records in [*runs, ("", before)] for key in ("loss", "eval_loss")):
        return waiting_figure(NO_STEP_YET)
    if is_grpo(runs[0][1]) or is_grpo(before):
        return reward_figure(runs, smoothing, log_scale, before)
    data, drawn = [], [(*run, color) for run, color in zip(runs, COLORS)]
    for label, records, color in [(BEFORE, before, BEFORE_COLOR)] * bool(before) + drawn:
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
            data.append(
                _line(
                    x, y, f"{label} eval loss", dict(color=color, dash="dot"), mode="lines+markers", marker=dict(size=7)
                )
            )
        steps, general = series(records, GENERAL_TEXT_LOSS)
        if steps:  # dataset.general_text: rising, the model forgets general language
            x, y = downsample(steps, general)
            line = dict(color=color, dash="dashdot", width=1.5)
            data.append(_line(x, y, f"{label} general-text loss", line, mode="lines+markers", marker=dict(size=6)))
    return _figure(data, with_marks(copy.deepcopy(_validated_loss_layout(log_scale)), marks))


def _smoothed(data: list, steps: list, values: list, name: str, color: str, smoothing: float, **axes) -> None:
    """A series raw (faint) and EMA-smoothed (bold), or raw alone without smoothing."""
    faint = smoothing > 0
    data.append(
        _line(
            *downsample(steps, values),
            name,
            dict(color=color, width=1 if faint else 2),
            opacity=0.3 if faint else 1.0,
            **axes,
        )
    )
    if faint:
        data.append(
            _line(*downsample(steps, ema(values, smoothing)), f"{name} smoothed", dict(color=color, width=2.5), **axes)
        )


def reward_figure(
    runs: Sequence[tuple[str, Sequence[LogRecord]]],
    smoothing: float = 0.6,
    log_scale: bool = False,
    before: Sequence[LogRecord] = (),
) -> go.Figure:
    """A GRPO run's measure first: "Reward", the answers' mean summed reward (raw and smoothed, eval_reward as
    markers) and each reward's mean as its own line; below it "Loss", near 0 in GRPO (the overlaid run's too); a
    resumed run's forebears' reward and loss lighter before them."""
    data = []
    steps, reward = series(before, "reward")
    if steps:
        _smoothed(data, steps, reward, f"{BEFORE} reward", BEFORE_COLOR, smoothing, xaxis="x", yaxis="y")
        x, y = downsample(*series(before, "loss"))
        data.append(
            _line(x, y, f"{BEFORE} loss", dict(color=BEFORE_COLOR, width=1), showlegend=False, xaxis="x2", yaxis="y2")
        )
    for shown, ((label, records), color) in enumerate(zip(runs, COLORS)):
        top = dict(xaxis="x", yaxis="y")
        steps, reward = series(records, "reward")
        if steps:
            _smoothed(data, steps, reward, f"{label} reward", color, smoothing, **top)
        names = dict.fromkeys(
            name for r in records for prefix in ("", "eval_") for name in r.get(f"{prefix}rewards") or {}
        )
        for name, reward_color in zip(names if shown == 0 else (), REWARD_COLORS):  # the shown run's alone
            x, y = downsample(*reward_series(records, name))
            data.append(_line(x, y, name, dict(color=reward_color, width=1.5), **top))
            x, y = downsample(*reward_series(records, name, "eval_"))
            if x:
                data.append(
                    _line(
                        x,
                        y,
                        f"eval {name}",
                        dict(color=reward_color, dash="dot"),
                        mode="lines+markers",
                        marker=dict(size=6),
                        **top,
                    )
                )
        x, y = downsample(*series(records, "eval_reward"))
        if x:
            data.append(
                _line(
                    x,
                    y,
                    f"{label} eval reward",
                    dict(color=color, dash="dot"),
                    mode="lines+markers",
                    marker=dict(size=7),
                    **top,
                )
            )
        x, y = downsample(*series(records, "loss"))
        data.append(_line(x, y, f"{label} loss", dict(color=color, width=1), showlegend=False, xaxis="x2", yaxis="y2"))
        x, y = downsample(*series(records, "eval_loss"))
        if x:
            data.append(
                _line(
                    x,
                    y,
                    f"{label} eval loss",
                    dict(color=color, dash="dot"),
                    mode="lines+markers",
                    showlegend=False,
                    xaxis="x2",
                    yaxis="y2",
                )
            )
    return _figure(data, copy.deepcopy(_validated_reward_layout(log_scale)))


def metrics_figure(records: Sequence[LogRecord]) -> go.Figure:
    """Learning rate, gradient norm, throughput and MFU (model FLOPs utilisation) side by side; below them
    a DPO or KTO run's rewards (PREFERENCE_PANELS), or a GRPO run's answers (GRPO_PANELS)."""
    logged = {key for r in records for key in r}
    below = second_row(logged)
    layout, data = copy.deepcopy(_validated_metrics_layout(below)), []
    for col, (key, title) in enumerate(METRIC_PANELS, start=1):
        x, y = downsample(*series(records, key))
        axis = "" if col == 1 else str(col)
        if key == "mfu" and records and not y:  # train.py logs none without a known peak: say so, draw no axes
            layout["annotations"].append(
                dict(
                    text=NO_MFU,
                    showarrow=False,
                    x=0.5,
                    y=0.5,
                    xref=f"x{axis} domain",
                    yref=f"y{axis} domain",
                    font=dict(color="#64748b"),
                )
            )
            for name in (f"xaxis{axis}", f"yaxis{axis}"):
                layout[name] = {**layout[name], "visible": False}
        data.append(_line(x, y, title, dict(color=COLORS[0]), showlegend=False, xaxis=f"x{axis}", yaxis=f"y{axis}"))
    if below:
        for panel, (keys, _) in enumerate(below, start=len(METRIC_PANELS) + 1):
            axes: dict[str, Any] = dict(showlegend=False, xaxis=f"x{panel}", yaxis=f"y{panel}")
            for key, color in zip(keys, COLORS):
                name = key.replace("_", " ")
                data.append(_line(*downsample(*series(records, key)), name, dict(color=color), **axes))
                x, y = downsample(*series(records, f"eval_{key}"))
                if x:
                    data.append(
                        _line(
                            x,
                            y,
                            f"eval {name}",
                            dict(color=color, dash="dot"),
                            mode="lines+markers",
                            marker=dict(size=6),
                            **axes,
                        )
                    )
    return _figure(data, layout)


def second_row(logged: set[str]) -> tuple:
    """The metrics chart's second row for a run that logged these keys: GRPO's answers (and its KL when it has a
    reference), a preference run's rewards, or none (SFT)."""
    family = chart_family(logged)
    if family == "answers":
        return GRPO_PANELS + ((GRPO_KL_PANEL,) if {"kl", "eval_kl"} & logged else ())
    return PREFERENCE_PANELS.get(family or "", ())


def chart_family(logged: set[str]) -> str | None:
    """The chart family of the objective whose record keys the run logged most of (the first in the table's order
    on a tie: objectives with the same keys share a family); None when it logged none of any (SFT)."""
    best = max(OBJECTIVES.values(), key=lambda o: len(o.record_keys.keys() & logged))
    return best.chart if best.record_keys.keys() & logged else None


# A live run's charts are redrawn every few seconds: Plotly's validation of every trace and layout
# property took ~110 ms of the panel's CPU per redraw. The layouts are built and validated once;
# a redraw copies one and adds plain trace dicts of known-good keys (tests/panel check they validate).
def _line(x: list, y: list, name: str, line: dict, mode: str = "lines", **more) -> dict:
    # A reward's name comes from the run's records: Plotly would draw its <a href> and <b> (app/untrusted_text.py).
    return dict(type="scatter", x=x, y=y, mode=mode, name=as_html(name), line=line, **more)


def _figure(data: list[dict], layout: dict) -> go.Figure:
    return go.Figure(dict(data=data, layout=layout), _validate=False)


@functools.cache
def _validated_loss_layout(log_scale: bool) -> dict:
    fig = go.Figure()
    fig.update_layout(title="Loss", xaxis_title="step", height=340, **_LAYOUT)
    fig.update_yaxes(type="log" if log_scale else "linear")
    return fig.to_plotly_json()["layout"]


@functools.cache
def _validated_reward_layout(log_scale: bool) -> dict:
    # The legend at the right: a line per reward would wrap a legend above the chart over its title.
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.68, 0.32],
        vertical_spacing=0.12,
        subplot_titles=["", "Loss (near 0 in GRPO: the reward is the measure)"],
    )
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(type="log" if log_scale else "linear", row=2, col=1)
    fig.update_layout(
        title="Reward (the answers' mean, summed over grpo.rewards; each reward's mean)",
        height=520,
        **{**_LAYOUT, "legend": dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.02)},
    )
    return fig.to_plotly_json()["layout"]


@functools.cache
def _validated_metrics_layout(below: tuple = ()) -> dict:
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
    for col, (keys, _) in enumerate(below, start=1):  # rewards and margins go below 0; shares are 0-100%
        if set(keys) <= {"reward_accuracy", *SHARES}:
            fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=2, col=col)
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
