"""The charts that split a run's numbers by where they come from: the loss of each dataset.mix source, and each
rank's own part of a step. Each is None when the run's records do not carry its data (a run without a mix, a run
on one process), so the Run tab shows it only where it means something.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import plotly.graph_objects as go

from tunedeck.app.charts import _LAYOUT, _figure, _line, downsample, ema
from tunedeck.backend.runs import LogRecord, is_number, source_label

# One color per source or rank; a run mixes at most 16 sources (backend/spec/sections.py), colors then repeat.
PALETTE = ("#4f46e5", "#ea580c", "#16a34a", "#db2777", "#0891b2", "#ca8a04", "#7c3aed", "#dc2626", "#65a30d")


def source_series(records: Sequence[LogRecord], key: str) -> dict[str, tuple[list, list]]:
    """{source: (steps, its loss)} of the records' `key` ("loss_by_source" or "eval_loss_by_source"), in the order
    the sources first appear."""
    out: dict[str, tuple[list, list]] = {}
    for r in records:
        for name, value in (r.get(key) or {}).items():
            if is_number(value) and math.isfinite(value) and "step" in r:
                steps, values = out.setdefault(str(name), ([], []))
                steps.append(r["step"])
                values.append(value)
    return out


def source_loss_figure(records: Sequence[LogRecord], smoothing: float = 0.6, log_scale: bool = False):
    """Each source's training loss (a line; EMA-smoothed as the loss chart is) and held-out loss (dotted, markers);
    None when the run logged no loss by source."""
    train, held_out = source_series(records, "loss_by_source"), source_series(records, "eval_loss_by_source")
    if not train and not held_out:
        return None
    names = list(dict.fromkeys([*train, *held_out]))
    data = []
    for index, name in enumerate(names):
        color, label = PALETTE[index % len(PALETTE)], source_label(name)
        if name in train:
            steps, values = train[name]
            values = ema(values, smoothing) if smoothing > 0 else values
            data.append(_line(*downsample(steps, values), label, dict(color=color, width=2), legendgroup=name))
        if name in held_out:
            steps, values = held_out[name]
            line, marker = dict(color=color, dash="dot"), dict(size=7)
            x, y = downsample(steps, values)
            data.append(_line(x, y, f"{label} eval", line, "lines+markers", marker=marker, legendgroup=name))
    return _figure(data, copy.deepcopy(_validated_breakdown_layout("source", log_scale)))


def rank_series(records: Sequence[LogRecord]) -> dict[int, tuple[list, list, str]]:
    """{rank: (steps, its own part of a step in seconds: batch wait + forward, its host)}."""
    out: dict[int, tuple[list, list, str]] = {}
    for r in records:
        for part in r.get("ranks") or []:
            seconds = float(part.get("data_s", 0.0)) + float(part.get("forward_s", 0.0))
            if "step" in r and math.isfinite(seconds):
                steps, values, _ = out.setdefault(int(part.get("rank", 0)), ([], [], str(part.get("host", ""))))
                steps.append(r["step"])
                values.append(seconds)
    return out


def rank_figure(records: Sequence[LogRecord]):
    """Each rank's batch wait + forward time per logging step, one line a rank: a slow data loader or GPU shows as
    the line above the others (backend/runs/slow_rank.py names it); None on one process."""
    ranks = rank_series(records)
    if len(ranks) < 2:
        return None
    hosts = {host for _, _, host in ranks.values()}
    data = []
    for index, (rank, (steps, values, host)) in enumerate(sorted(ranks.items())):
        label = f"rank {rank}" + (f" ({host})" if len(hosts) > 1 else "")
        data.append(_line(*downsample(steps, values), label, dict(color=PALETTE[index % len(PALETTE)], width=2)))
    return _figure(data, copy.deepcopy(_validated_breakdown_layout("rank", False)))


TITLES = {
    "source": "Loss by data source (dataset.mix); held-out: dotted",
    "rank": "Each rank's own part of a step: batch wait + forward (s)",
}


@functools.cache
def _validated_breakdown_layout(kind: str, log_scale: bool) -> dict:
    fig = go.Figure()
    # The legend below: a line per source, named by its mix entry, would run over the title above the chart.
    legend = dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0)
    fig.update_layout(title=TITLES[kind], xaxis_title="step", height=340, **{**_LAYOUT, "legend": legend})
    fig.update_yaxes(type="log" if log_scale else "linear", rangemode="normal" if log_scale else "tozero")
    return fig.to_plotly_json()["layout"]
