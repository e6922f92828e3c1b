"""The Run tab's charts: the smoothing, log-scale and overlay controls, the line on what an overlaid run did
differently, the loss and metrics charts, and, where the run's records carry them, the loss of each dataset.mix
source and each rank's own part of a step (app/breakdown_charts.py). RunView decides when they are due; this draws
them.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from tunedeck.app.breakdown_charts import rank_figure, source_loss_figure
from tunedeck.app.chart_marks import health_marks
from tunedeck.app.charts import loss_figure, metrics_figure
from tunedeck.app.registry import Updates
from tunedeck.app.run_index import compared_line
from tunedeck.backend.runs import Lineage, RunManager

# What a redraw of the charts may send, in the order of RunCharts.outputs.
OUTPUTS = ("overlay", "compared", "loss_plot", "metrics_plot", "source_plot", "rank_plot")


class RunCharts:
    """The charts' components (built into the Run tab's layout) and their drawing."""

    def __init__(self, manager: RunManager, lineage: Lineage):
        self.manager = manager
        self.lineage = lineage  # a resumed run's forebears, whose loss the chart draws before its own

    def build(self, add: Callable) -> None:
        with gr.Row():
            self.smoothing = add(
                "run.smoothing",
                gr.Slider(0, 0.99, value=0.6, step=0.01, label="Smoothing (EMA weight)", elem_id="smoothing"),
            )
            self.log_scale = add("run.log_scale", gr.Checkbox(label="Log scale", value=False, elem_id="log-scale"))
            self.overlay = add(
                "run.overlay",
                gr.Dropdown(
                    label="Overlay the loss of", choices=[], value=None, elem_id="overlay-select", filterable=False
                ),
            )
        self.compared = add("run.compared", gr.Markdown(elem_id="run-compared"))
        self.loss_plot = add("run.loss_chart", gr.Plot(show_label=False, elem_id="loss-chart"))
        self.metrics_plot = add("run.metrics_chart", gr.Plot(show_label=False, elem_id="metrics-chart"))
        # Only where the run has their data: a dataset.mix run's sources, a run on several processes' ranks.
        self.source_plot = add("run.source_chart", gr.Plot(show_label=False, elem_id="source-chart", visible=False))
        self.rank_plot = add("run.rank_chart", gr.Plot(show_label=False, elem_id="rank-chart", visible=False))

    @property
    def outputs(self) -> list:
        return [getattr(self, name) for name in OUTPUTS]

    @property
    def options(self) -> list:
        """The chart options a redraw reads."""
        return [self.smoothing, self.log_scale, self.overlay]

    def draw(self, out: Updates, run_id: str, watch, other, overlay: str | None, job, look: Callable, **options):
        """The charts of `watch` (the run's RunWatch) and `other` (an overlaid run's, or None) into `out`; `look`
        gives a run's RunWatch (the forebears of a resumed run); options: smoothing, log_scale, compare (whether
        to say again what the overlaid run did differently)."""
        smoothing, log_scale = options["smoothing"], options["log_scale"]
        if options.get("compare"):
            out[self.compared] = compared_line(self.manager, run_id, other and overlay)
        drawn_runs = [("this run", watch.records)] + ([(overlay, other.records)] if other and overlay else [])
        before = self.lineage.records_before(run_id, job, watch, look)
        out[self.loss_plot] = loss_figure(drawn_runs, smoothing, log_scale, before, health_marks(watch.health))
        out[self.metrics_plot] = gr.update(value=metrics_figure(watch.records), visible=bool(watch.records))
        sources = source_loss_figure(watch.records, smoothing, log_scale)
        out[self.source_plot] = gr.update(value=sources, visible=sources is not None)
        ranks = rank_figure(watch.records)
        out[self.rank_plot] = gr.update(value=ranks, visible=ranks is not None)
