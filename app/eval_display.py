"""How a run's evaluation shows in the Try · Evaluate · Export tab: its table, its chart, and every answer
side by side (plain values: app/after_tab.py puts them in the components)."""

from __future__ import annotations

from html import escape
from pathlib import Path

import plotly.graph_objects as go

from tunedeck.app.charts import waiting_figure
from tunedeck.backend.eval_answers import answers_table
from tunedeck.backend.eval_results import order_key, table_rows

EVAL_HEADERS = ["model", "loss", "perplexity", "exact match", "contains match", "ROUGE-L", "examples", "data"]


def evaluation(data: dict) -> dict:
    """The metrics table and the chart of eval.json's content; the data by its file name (and split), which keeps
    the table within its half of the row (the status line and eval.json have the whole path)."""
    rows = [[*map(_fmt, row[:-1]), _file_name(row[-1])] for row in table_rows(data)]
    return {"after.eval_table": rows, "after.eval_chart": eval_figure(data)}


def answers_shown(answers: dict[str, list[dict]], show: str) -> dict:
    """The answers table ({"headers", "data"}, as gr.Dataframe takes it) and the line above it."""
    headers, rows, line = answers_table(answers, show)
    line += " · **click a row to try it** in the Try box" if rows else ""
    return {"after.answers": {"headers": headers, "data": rows}, "after.answers_note": line}


def evaluated_on(data: dict) -> str:
    """The line above the table: what the newest evaluation read, in full (or why there is none)."""
    if data.get("error") or not data["results"]:
        return data.get("error") or "not evaluated yet"
    newest = max(data["results"].values(), key=lambda r: r.get("evaluated_at") or 0)
    if not newest.get("data"):
        return ""
    device = f" on {escape(str(newest['device']))}" if newest.get("device") else ""
    return f"last evaluated on `{escape(str(newest['data']))}`{device}"


def _file_name(source: str | None) -> str | None:
    return source and Path(source).name


def _fmt(value):
    return round(value, 4) if isinstance(value, float) else value


def eval_figure(data: dict) -> go.Figure:
    """Loss, exact match and ROUGE-L per evaluated model, base first and checkpoints by step (a note before any)."""
    names = sorted(data.get("results", {}), key=order_key)
    if not names:
        return waiting_figure("Evaluate: the loss, exact match and ROUGE-L of each model appear here.", height=220)
    results = [data["results"][n] for n in names]
    figure = go.Figure()
    figure.add_bar(x=names, y=[r.get("loss") for r in results], name="loss", marker_color="#4f46e5")
    for key, label, color in (("exact_match", "exact match", "#ea580c"), ("rouge_l", "ROUGE-L", "#0d9488")):
        if any(r.get(key) is not None for r in results):
            figure.add_scatter(
                x=names,
                y=[r.get(key) for r in results],
                name=label,
                yaxis="y2",
                mode="lines+markers",
                marker_color=color,
            )
    figure.update_layout(
        template="plotly_white", margin=dict(l=50, r=50, t=30, b=40), legend=dict(orientation="h", y=1.08),
        yaxis=dict(title="loss"), yaxis2=dict(title="exact match · ROUGE-L", overlaying="y", side="right", range=[0, 1]),
    )  # fmt: skip
    return figure
