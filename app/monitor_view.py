"""The GPU monitor tab: gauges per GPU (NVML) and for the host (psutil), with sparklines.

Reads the shared Monitor's ring buffer; never touches NVML itself. Without an NVIDIA
GPU it says so plainly and still shows CPU and RAM. Drawn on the tab's own tick only while
its tab is in view, and only when a new sample arrived. Each Gradio event and each Plotly
redraw costs the browser far more than its answer (app/section.py), so the tab ticks once a
second, as the monitor samples, and redraws its sparklines at most every SPARK_EVERY_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go
import psutil
from plotly.subplots import make_subplots

from tunedeck.app.gauges import bar, gpu_card
from tunedeck.app.registry import Got, Updates
from tunedeck.app.run_machines import RunMachines
from tunedeck.app.section import Page, Section
from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.machine import Monitor, Sample

SPARK_SAMPLES = 120  # two minutes at one sample a second
TICK_S = 1.0  # backend/machine/monitor.py samples once a second
SPARK_EVERY_S = 5.0  # the sparklines span two minutes: five seconds late is a 4% shift


def monitor_html(monitor: Monitor, sample: Sample | None) -> str:
    parts = []
    if monitor.gpu_error and not (sample and sample.gpus):
        parts.append(
            f"<div class='td-card td-nogpu' id='no-gpu'>{as_html(monitor.gpu_error)} CPU and RAM are still shown.</div>"
        )
    elif monitor.gpu_error:
        parts.append(f"<div class='td-card td-nogpu'>{as_html(monitor.gpu_error)}</div>")
    if sample:
        parts.extend(gpu_card(g) for g in sample.gpus)
        host = [
            bar("CPU", sample.cpu_percent / 100, f"{sample.cpu_percent:.0f}% of {psutil.cpu_count()} cores"),
            bar(
                "RAM",
                sample.ram_used_gb / sample.ram_total_gb,
                f"{sample.ram_used_gb:.1f} / {sample.ram_total_gb:.1f} GB",
            ),
        ]
        parts.append(f"<div class='td-card' id='host-gauges'><b>Host</b>{''.join(host)}</div>")
    else:
        parts.append("<div class='td-card'>Waiting for the first sample…</div>")
    return f"<div class='td-cards'>{''.join(parts)}</div>"


def sparklines(history: list[Sample]) -> go.Figure:
    """CPU, RAM and, per GPU, utilisation and memory over the last samples."""
    history = history[-SPARK_SAMPLES:]
    gpu_count = max((len(s.gpus) for s in history), default=0)
    titles = ["CPU %", "RAM %"] + [t for i in range(gpu_count) for t in (f"GPU {i} util %", f"GPU {i} memory %")]
    cols = 2
    rows = (len(titles) + 1) // 2
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.5 / max(rows, 1))
    seconds = [s.time - history[-1].time for s in history] if history else []
    series: list[list[float | None]] = [  # None: a GPU the sample did not see
        [s.cpu_percent for s in history],
        [100 * s.ram_used_gb / s.ram_total_gb for s in history],
    ]
    for i in range(gpu_count):
        series.append([(s.gpus[i].utilization_pct or 0) if i < len(s.gpus) else None for s in history])
        series.append(
            [100 * s.gpus[i].memory_used_mb / s.gpus[i].memory_total_mb if i < len(s.gpus) else None for s in history]
        )
    for n, (title, ys) in enumerate(zip(titles, series)):
        fig.add_scatter(
            x=seconds,
            y=ys,
            name=title,
            mode="lines",
            fill="tozeroy",
            line=dict(color="#4f46e5", width=1.5),
            row=n // cols + 1,
            col=n % cols + 1,
            showlegend=False,
        )
    fig.update_yaxes(range=[0, 100])
    fig.update_xaxes(title_text="seconds ago", showticklabels=True)
    fig.update_layout(
        height=190 * rows, margin=dict(l=40, r=10, t=30, b=30), template="plotly_white", uirevision="keep"
    )
    return fig


@dataclass(frozen=True)
class MonitorShown:
    """What one browser's GPU tab shows (its gr.State)."""

    sample_time: float | None = None  # the sample drawn; None: redraw when the tab comes into view
    sparks_at: float = 0.0  # time.monotonic() of the last sparkline redraw; 0: redraw them at the next draw


class MonitorView(Section):
    id, title = "gpus", "GPUs"

    def __init__(
        self,
        monitor: Monitor,
        cluster_runs: Callable[[], list] | None = None,
        run_folder: Callable[[str], Path] | None = None,
    ):
        self.monitor = monitor
        self.cluster_runs = cluster_runs  # live Slurm runs (RunStatus): their GPUs are on the nodes they hold
        self.run_folder = run_folder  # a run's folder, where every machine of it writes its telemetry
        self.run_machines = RunMachines()

    def build(self, page: Page) -> None:
        add = page.ui.add
        self.gauges = add(
            "monitor.gauges", gr.HTML(monitor_html(self.monitor, self.monitor.latest()), elem_id="gpu-monitor")
        )
        self.history = add("monitor.history", gr.Plot(show_label=False, elem_id="monitor-sparklines"))
        self.shown = add("monitor.shown", gr.State(MonitorShown()))

    def wire(self, page: Page) -> None:
        page.on_tick(
            self.id, self.tick, inputs=[self.shown], outputs=[self.gauges, self.history, self.shown], every_s=TICK_S
        )

    def tick(self, got: Got, in_view: str) -> Updates:
        """The newest sample while the tab is in view (its sparklines at most every SPARK_EVERY_S); nothing
        when no new sample arrived since the last draw."""
        shown = got[self.shown]
        if in_view != self.id:
            return {self.shown: MonitorShown()} if shown != MonitorShown() else {}
        sample = self.monitor.latest()
        if sample is not None and sample.time == shown.sample_time:
            return {}
        drawn: Updates = {self.gauges: monitor_html(self.monitor, sample) + self._cluster_html()}
        sparks_at = shown.sparks_at
        if not sparks_at or time.monotonic() - sparks_at >= SPARK_EVERY_S:
            drawn[self.history], sparks_at = sparklines(self.monitor.history()), time.monotonic()
        return {**drawn, self.shown: MonitorShown(sample.time if sample else None, sparks_at)}

    def _cluster_html(self) -> str:
        """Per live Slurm run: the nodes it holds, each with its GPUs and host as the run's telemetry says."""
        if self.cluster_runs is None:
            return ""
        parts = []
        for run in self.cluster_runs():
            nodes = (run.slurm or {}).get("nodes") or []
            title = f"Slurm job {run.slurm.get('job_id')} (run {run.run_id})"
            if not nodes:
                parts.append(f"<div>{as_html(title)} waits for nodes.</div>")
            elif self.run_folder is None:
                parts.append(f"<div>{as_html(title)} holds {as_html(', '.join(nodes))}.</div>")
            else:
                folder = self.run_folder(run.run_id)
                parts.append(self.run_machines.html(f"{title} on {', '.join(nodes)}", folder, len(nodes)))
        return f"<div class='td-card' id='slurm-nodes'><b>Slurm</b>{''.join(parts)}</div>" if parts else ""


CSS = """
.td-cards { display: flex; flex-wrap: wrap; gap: 12px; }
.td-card { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 10px 14px; min-width: 300px; flex: 1; }
.td-nogpu { background: var(--background-fill-secondary); font-weight: 600; flex-basis: 100%; }
.td-gauge { margin-top: 6px; }
.td-gauge-label { display: flex; justify-content: space-between; font-size: 0.85em; }
.td-gauge-track { height: 10px; border-radius: 5px; background: var(--background-fill-secondary); overflow: hidden; }
.td-gauge-fill { height: 100%; }
.td-procs { font-size: 0.8em; margin: 6px 0 0 0; }
.td-warn { color: #b45309; font-weight: 600; margin: 4px 0; }
"""
