"""How a run's evaluation shows in the Try · Evaluate · Export tab: its table, its chart, and every answer
side by side (plain values: app/after_tab.py puts them in the components)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from tunedeck.app.charts import waiting_figure
from tunedeck.app.untrusted_text import as_html, as_text, code_span
from tunedeck.backend.after import (
    BUILTIN_NAME,
    EvalDataError,
    answers_table,
    order_key,
    parse_tasks,
    read_general_text,
    seen_warning,
    table_columns,
    table_rows,
)

ANSWER_CHARS = 240  # of an answer in its cell: up to 256 new tokens for a prompt without the data's answer
EVAL_HEADERS = [
    "model", "loss", "perplexity", "exact match", "contains match", "ROUGE-L", "chosen preferred", "examples", "data",
]  # fmt: skip


HEADERS = dict(zip(table_columns({}), EVAL_HEADERS, strict=True)) | {"general_text_loss": "general-text loss"}


def evaluation(data: dict) -> dict:
    """The metrics table ({"headers", "data"}: a column per benchmark task, named as the task, and one for the
    general-text loss where measured) and the chart of eval.json's content; the data by its file name (and split),
    which keeps the table within its half of the row (the status line and eval.json have the whole path)."""
    headers = [HEADERS.get(column, column) for column in table_columns(data)]
    rows = [[*map(_fmt, row[:-1]), _file_name(row[-1])] for row in table_rows(data)]
    return {"after.eval_table": {"headers": headers, "data": rows}, "after.eval_chart": eval_figure(data)}


def eval_checks(tasks: str | None, tasks_limit: int | None, forgetting: bool, general_text: str | None) -> dict:
    """The worker's arguments for the Benchmarks box (task names), its questions per task (0: all) and the
    forgetting check (an uploaded text file, read now so a bad one is said at once; else the built-in sample)."""
    checks: dict = {}
    names = parse_tasks(tasks)
    if names:
        checks.update(tasks=list(names), tasks_limit=int(tasks_limit) if tasks_limit else None)
    if general_text:
        read_general_text(general_text)
        checks["general_text"] = general_text
    elif forgetting:
        checks["general_text"] = BUILTIN_NAME
    return checks


def answers_shown(answers: dict[str, list[dict]], show: str) -> dict:
    """The answers table ({"headers", "data"}, as gr.Dataframe takes it) and the line above it."""
    headers, rows, line = answers_table(answers, show)
    line = as_text(line) + (" · **click a row to try it** in the Try box" if rows else "")  # the models' names
    return {"after.answers": {"headers": headers, "data": rows}, "after.answers_note": line}


def answers_widths(columns: int) -> list[str | int]:
    """#, the prompt and the data's answer keep their width; the models' answers share the rest (without widths
    of its own, a long answer would squeeze the data's answer to a letter and push the next model out of sight)."""
    models = columns - 3
    return ["4%", "26%", "14%", *[f"{56 // models}%"] * models] if models else ["6%", "64%", "30%"]


def refused(exc: Exception) -> str:
    """The Evaluate status line for what stopped an evaluation: the page's words where the error has them
    (backend/after/eval_data.py: EvalDataError), as text."""
    said = exc.said("page") if isinstance(exc, EvalDataError) else str(exc)
    return f"✗ {as_text(said)}"


def seen_line(reason: str | None) -> str:
    """The status line's warning for evaluation data the model trained on ("" for held-out data), as text."""
    return seen_warning(as_text(reason)) if reason else ""  # the reason names the files


def newest_source(data: dict) -> str | None:
    """The data the newest evaluation read, as eval.json names it."""
    results = data.get("results") or {}
    newest = max(results.values(), key=lambda r: r.get("evaluated_at") or 0, default={})
    return newest.get("data")


def evaluated_on(data: dict) -> str:
    """The line above the table: what the newest evaluation read, in full (or why there is none)."""
    if data.get("error") or not data["results"]:
        return as_text(data.get("error") or "not evaluated yet")
    newest = max(data["results"].values(), key=lambda r: r.get("evaluated_at") or 0)
    if not newest.get("data"):
        return ""
    device = f" on {as_text(newest['device'])}" if newest.get("device") else ""
    return f"last evaluated on {code_span(newest['data'])}{device}"


def _file_name(source: str | None) -> str | None:
    return source and Path(source).name


def _fmt(value):
    """4 decimals; "—" for what the evaluation could not measure (no answers in its data)."""
    return "—" if value is None else round(value, 4) if isinstance(value, float) else value


def eval_figure(data: dict) -> go.Figure:
    """Loss, exact match and ROUGE-L per evaluated model, base first and checkpoints by step (a note before any);
    the general-text loss and each benchmark's score where measured."""
    names = sorted(data.get("results", {}), key=order_key)
    if not names:
        return waiting_figure("Evaluate: the loss, exact match and ROUGE-L of each model appear here.", height=220)
    results = [data["results"][n] for n in names]
    measured = ("loss", "exact_match", "rouge_l", "benchmarks", "general_text")
    if all(r.get(key) is None for r in results for key in measured):
        return waiting_figure("No loss or score: the data had no answers to measure by. Each answer is below.", 220)
    names = [as_html(n) for n in names]  # eval.json's keys: Plotly draws the HTML in its axis labels
    figure = go.Figure()
    figure.add_bar(x=names, y=[r.get("loss") for r in results], name="loss", marker_color="#4f46e5")
    if any(r.get("general_text") for r in results):  # the forgetting check's, beside the data's loss
        losses = [(r.get("general_text") or {}).get("loss") for r in results]
        figure.add_bar(x=names, y=losses, name="general-text loss", marker_color="#94a3b8")
    scores = (("exact_match", "exact match", "#ea580c"), ("rouge_l", "ROUGE-L", "#0d9488"),
              ("preferred", "chosen preferred", "#9333ea"))  # fmt: skip
    for key, label, color in scores:
        if any(r.get(key) is not None for r in results):
            figure.add_scatter(
                x=names,
                y=[r.get(key) for r in results],
                name=label,
                yaxis="y2",
                mode="lines+markers",
                marker_color=color,
            )
    for task in dict.fromkeys(t for r in results for t in r.get("benchmarks") or {}):  # each task's score
        got = [(r.get("benchmarks") or {}).get(task) or {} for r in results]
        metric = next(g["metric"] for g in got if g)
        if not all(0 <= g["score"] <= 1 for g in got if g):  # a perplexity or a count: the table has it
            continue
        figure.add_scatter(
            x=names,
            y=[g.get("score") for g in got],
            name=as_html(f"{task} ({metric})"),
            yaxis="y2",
            mode="lines+markers",
            line=dict(dash="dot"),
        )
    figure.update_layout(
        template="plotly_white",
        margin=dict(l=50, r=50, t=30, b=40),
        legend=dict(orientation="h", y=1.08),
        yaxis=dict(title="loss"),
        yaxis2=dict(title="share of answers, pairs or questions", overlaying="y", side="right", range=[0, 1]),
    )
    return figure
