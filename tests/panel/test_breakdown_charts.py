"""The Run tab's charts by data source (dataset.mix) and by rank: a line each, only where the records carry them."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from tunedeck.app.breakdown_charts import rank_figure, source_loss_figure
from tunedeck.app.run_view import RunShown
from tunedeck.backend.runs.manager import RunManager

from .test_run_view import RUN_ID, Drawn, finished_run

SUBS = "/data/mix/subtract.jsonl:train[:90%]#300"


def mixed_records() -> list[dict]:
    """A 2-rank mixed run's log records: rank 1 waits 0.3 s more for each batch; an evaluation at step 4."""
    records = []
    for step in range(1, 7):
        by_source = {"dataset.path": 3.0 / step, SUBS: 4.0 / step}
        ranks = [
            {"rank": 0, "host": "node-a", "data_s": 0.01, "forward_s": 0.05},
            {"rank": 1, "host": "node-a", "data_s": 0.31, "forward_s": 0.05},
        ]
        records.append({"event": "log", "step": step, "loss": 3.5 / step, "loss_by_source": by_source, "ranks": ranks})
    records.append(
        {"event": "log", "step": 4, "eval_loss": 1.0, "eval_loss_by_source": {"dataset.path": 0.8, SUBS: 1.2}}
    )
    return records


def test_the_source_chart_draws_each_sources_training_and_held_out_loss():
    figure = source_loss_figure(mixed_records(), smoothing=0.0)
    go.Figure(figure.to_dict())  # plotly's own validation of the traces built without it
    assert [t.name for t in figure.data] == ["dataset.path", "dataset.path eval", "subtract.jsonl:train[:90%]#300",
                                             "subtract.jsonl:train[:90%]#300 eval"]  # fmt: skip
    assert list(figure.data[2].y) == [4.0 / step for step in range(1, 7)]
    assert list(figure.data[3].x) == [4] and list(figure.data[3].y) == [1.2]
    assert figure.data[0].line.color != figure.data[2].line.color
    smoothed = source_loss_figure(mixed_records(), smoothing=0.6)
    assert smoothed.data[0].y[0] == pytest.approx(3.0) and smoothed.data[0].y[-1] > 0.5  # EMA lags the falling loss
    assert source_loss_figure(mixed_records(), log_scale=True).layout.yaxis.type == "log"


def test_the_rank_chart_draws_each_ranks_own_part_and_the_slow_one_stands_out():
    figure = rank_figure(mixed_records())
    go.Figure(figure.to_dict())
    assert [t.name for t in figure.data] == ["rank 0", "rank 1"]
    assert all(slow > fast + 0.25 for fast, slow in zip(figure.data[0].y, figure.data[1].y))
    two_hosts = [{**r, "ranks": [{**p, "host": f"node-{p['rank']}"} for p in r["ranks"]]} for r in mixed_records()[:6]]
    assert [t.name for t in rank_figure(two_hosts).data] == ["rank 0 (node-0)", "rank 1 (node-1)"]


def test_without_their_data_there_is_no_chart():
    plain = [{"event": "log", "step": s, "loss": 1.0 / s} for s in (1, 2)]
    assert source_loss_figure(plain) is None and rank_figure(plain) is None
    one_rank = [{**r, "ranks": r["ranks"][:1]} for r in mixed_records()[:6]]
    assert rank_figure(one_rank) is None


def test_the_run_tab_shows_the_charts_only_for_a_run_that_has_their_data(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    run_dir = finished_run(tmp_path)
    drawn = Drawn(RunManager(tmp_path))
    first = drawn.render(RunShown())
    assert first["source_chart"]["visible"] is False and first["rank_chart"]["visible"] is False
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps({**r, "step": r["step"] + 3, "max_steps": 9}) + "\n" for r in mixed_records())
    again = drawn.render(first["shown"])
    assert again["source_chart"]["visible"] is True and again["rank_chart"]["visible"] is True
    assert len(again["source_chart"]["value"].data) == 4 and len(again["rank_chart"]["value"].data) == 2
    assert first["shown"].run == RUN_ID
