"""How a run's evaluation shows in the Try · Evaluate · Export tab: its table, its chart, and every answer
side by side (plain values: app/after_tab.py puts them in the components)."""

from __future__ import annotations

import plotly.graph_objects as go

from tunedeck.app.charts import waiting_figure
from tunedeck.backend.eval_answers import answers_table
from tunedeck.backend.eval_results import order_key, table_rows

EVAL_HEADERS = ["model", "loss", "perplexity", "exact match", "contains match", "examples", "data"]


def evaluation(data: dict) -> dict:
    """The metrics table and the chart of eval.json's content."""
    rows = [[_fmt(v) for v in row] for row in table_rows(data)]
    return {"after.eval_table": rows, "after.eval_chart": eval_figure(data)}


def answers_shown(answers: dict[str, list[dict]], show: str) -> dict:
    """The answers table ({"headers", "data"}, as gr.Dataframe takes it) and the line above it."""
    headers, rows, line = answers_table(answers, show)
    return {"after.answers": {"headers": headers, "data": rows}, "after.answers_note": line}


def _fmt(value):
    return round(value, 4) if isinstance(value, float) else value


def eval_figure(data: dict) -> go.Figure:
    """Loss and exact match per evaluated model, base first and checkpoints by step (a note before any)."""
    names = sorted(data.get("results", {}), key=order_key)
    if not names:
        return waiting_figure("Evaluate: the loss and exact match of each model appear here.", height=220)
    results = [data["results"][n] for n in names]
    figure = go.Figure()
    figure.add_bar(x=names, y=[r.get("loss") for r in results], name="loss", marker_color="#4f46e5")
    if any(r.get("exact_match") is not None for r in results):
        figure.add_scatter(
            x=names,
            y=[r.get("exact_match") for r in results],
            name="exact match",
            yaxis="y2",
            mode="lines+markers",
            marker_color="#ea580c",
        )
    figure.update_layout(
        template="plotly_white", margin=dict(l=50, r=50, t=30, b=40), legend=dict(orientation="h", y=1.08),
        yaxis=dict(title="loss"), yaxis2=dict(title="exact match", overlaying="y", side="right", range=[0, 1], tickformat=".0%"),
    )  # fmt: skip
    return figure
