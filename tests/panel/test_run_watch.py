"""Reading a run folder incrementally, and the summaries the run view shows (no browser)."""

from __future__ import annotations

import json

from tunedeck.app.charts import MAX_POINTS, NO_MFU, downsample, ema, loss_figure, metrics_figure
from tunedeck.app.run_watch import RunWatch
from tunedeck.backend.runs.summary import facts_line, measured_peaks, summarize


def append(path, *records):
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_watch_reads_only_what_was_appended(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    (tmp_path / "logs").mkdir()
    metrics = tmp_path / "metrics.jsonl"
    watch = RunWatch(tmp_path)
    assert watch.refresh() == 0 and watch.records == []  # nothing written yet

    append(metrics, {"event": "start", "world_size": 2, "max_steps": 10}, {"event": "log", "step": 1, "loss": 2.0})
    (tmp_path / "logs" / "rank0.log").write_text("step 1\n 10%|#  | 1/10\r 20%|##  | 2/10\n")
    v1 = watch.refresh()
    assert v1 == 1 and watch.start["world_size"] == 2 and [r["step"] for r in watch.records] == [1]
    assert watch.log_text() == ("rank0.log", "step 1\n 20%|##  | 2/10")  # a progress bar shows its last state

    assert watch.refresh() == v1  # nothing new: same version, nothing re-read

    with open(metrics, "a") as f:
        f.write('{"event": "log", "step": 2, "lo')  # the trainer is mid-line
    assert watch.refresh() == v1 and len(watch.records) == 1
    with open(metrics, "a") as f:
        f.write('ss": 1.5}\n')
    assert watch.refresh() == v1 + 1 and [r["loss"] for r in watch.records] == [2.0, 1.5]


def test_launcher_log_shown_until_rank0_writes(tmp_path, monkeypatch):
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launcher.log").write_text("launching 2 processes\n")
    watch = RunWatch(tmp_path)
    watch.refresh()
    assert watch.log_text() == ("launcher.log", "launching 2 processes")


def test_facts_line_says_what_the_run_got():
    start = {
        "world_size": 2,
        "distributed_type": "DEEPSPEED",
        "zero_stage": 3,
        "trainable_params": 40_000_000,
        "total_params": 10_000_000_000,
        "method": "qlora",
        "model_class": "DeepSpeedEngine",
    }
    assert facts_line(start) == (
        "2 ranks · DeepSpeed ZeRO-3 · 0.4% of parameters trainable (40,000,000 of 10,000,000,000) · qlora · DeepSpeedEngine"
    )
    assert facts_line({"world_size": 2, "distributed_type": "MULTI_CPU"}).startswith("2 ranks · DDP")
    assert facts_line(None) == ""


def test_progress_with_eta(tmp_path):
    watch = RunWatch(tmp_path)
    # The pace is the trainer's (monotonic clock), not the records' wall-clock times: here the clock was stepped back.
    watch.records = [{"step": 10, "time": 100.0, "max_steps": 100},
                     {"step": 20, "time": 40.0, "max_steps": 100, "seconds_per_step": 1.0}]  # fmt: skip
    summary = summarize(watch, started_at=90.0, ended_at=None, now=111.0)
    assert summary.fraction == 0.2
    assert summary.progress == "step 20/100 · elapsed 0:21 · ETA 1:20"  # 80 steps at 1 s per step
    done = summarize(watch, started_at=90.0, ended_at=115.0).progress
    assert "ETA" not in done and "elapsed 0:25" in done


def test_measured_peaks_are_per_rank_maxima(tmp_path):
    watch = RunWatch(tmp_path)
    watch.records = [{"gpu_peak_allocated_gb": [10.0, 11.0]}, {"gpu_peak_allocated_gb": [12.0, 9.0]}, {"loss": 1}]
    assert measured_peaks(watch) == {"allocated": [12.0, 11.0]}


def test_long_runs_are_downsampled_keeping_the_last_point():
    xs = list(range(100_000))
    x, y = downsample(xs, [v * 2 for v in xs])
    assert len(x) <= MAX_POINTS and x[0] == 0 and x[-1] == 99_999 and y[-1] == 199_998
    records = [
        {"step": i, "loss": 1 / (i + 1), "learning_rate": 1e-4, "grad_norm": 1.0, "tokens_per_second": 5e3}
        for i in range(50_000)
    ]
    fig = loss_figure([("this run", records)], smoothing=0.9, log_scale=True)
    assert all(len(trace.x) <= MAX_POINTS for trace in fig.data)
    assert fig.layout.yaxis.type == "log"
    assert all(len(trace.x) <= MAX_POINTS for trace in metrics_figure(records).data)


def test_ema_removes_startup_bias_and_smooths():
    assert ema([4.0, 4.0, 4.0], 0.9) == [4.0, 4.0, 4.0]
    smoothed = ema([1.0, 0.0, 1.0, 0.0], 0.5)
    assert smoothed[0] == 1.0 and max(smoothed[1:]) - min(smoothed[1:]) < 1.0


def test_loss_figure_overlays_and_marks_eval_loss():
    a = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0, "eval_loss": 1.2}]
    b = [{"step": 1, "loss": 3.0}]
    names = [t.name for t in loss_figure([("this run", a), ("other", b)], smoothing=0.5).data]
    assert names == ["this run loss", "this run smoothed", "this run eval loss", "other loss", "other smoothed"]


def test_mfu_is_charted_beside_tokens_per_second_and_a_cpu_run_says_why_not():
    gpu = [{"step": i, "loss": 1.0, "tokens_per_second": 5e3, "mfu": 0.41} for i in range(1, 4)]
    fig = metrics_figure(gpu)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[2:] == ["tokens / s", "MFU"]  # side by side
    mfu_trace = fig.data[-1]
    assert list(mfu_trace.y) == [0.41] * 3 and fig.layout.yaxis4.tickformat == ".0%"
    cpu = metrics_figure([{"step": 1, "loss": 1.0, "tokens_per_second": 500.0}])
    assert any(NO_MFU in a.text for a in cpu.layout.annotations)
    assert cpu.layout.xaxis4.visible is False and cpu.layout.yaxis4.visible is False  # no empty 0-100% axes
    assert not any(NO_MFU in a.text for a in fig.layout.annotations) and fig.layout.yaxis4.visible is not False


def test_the_charts_built_without_plotly_validation_pass_it_and_do_not_share_layouts():
    """charts.py skips Plotly's per-redraw validation for speed: every figure it builds must still validate
    (go.Figure(dict) raises on an unknown or bad property), and one figure's annotation must not leak into
    the cached layout the next figure copies."""
    import plotly.graph_objects as go

    records = [{"step": i, "loss": 1 / i, "eval_loss": 1.1 / i, "learning_rate": 1e-4, "grad_norm": 0.5,
                "tokens_per_second": 5e3} for i in range(1, 30)]  # fmt: skip
    with_mfu = [dict(r, mfu=0.4) for r in records]
    figures = [
        loss_figure([("this run", records), ("other", with_mfu)], smoothing=0.6, log_scale=True),
        loss_figure([("this run", records)], smoothing=0.0),
        metrics_figure(records),
        metrics_figure(with_mfu),
    ]
    for fig in figures:
        go.Figure(fig.to_plotly_json())  # raises ValueError on anything Plotly would reject
    assert json.loads(figures[0].to_json())["layout"]["template"]["layout"]["plot_bgcolor"] == "white"
    assert sum(NO_MFU in a.text for a in metrics_figure(records).layout.annotations) == 1
    after = metrics_figure(with_mfu)
    assert not any(NO_MFU in a.text for a in after.layout.annotations) and after.layout.yaxis4.visible is not False
