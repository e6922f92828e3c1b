"""The memory estimate beside the form: GPU size, recommendation, Apply, table and bar chart.

A DerivedView of the job: the job's evaluation (job_outputs.evaluate) compares the
strategies once per change into one Advice, and the text, the Apply button, the table and
the chart all read it, in the same handler as the files (no extra event chain). The
figures themselves come from app/estimate_view.py (pure builders).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from tunedeck.app.estimate_view import (
    Unavailable,
    compute_advice,
    estimate_figure,
    estimate_table,
    measured_markdown,
    recommendation_markdown,
)
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.job_view import DerivedView
from tunedeck.app.registry import Got, Registry, Updates
from tunedeck.backend.hardware import machine_facts


def default_machine(monitor) -> tuple[str, str, str, str]:
    """(GPU box value, its source, RAM box value, its source): the facts `tunedeck validate` uses too."""
    m = machine_facts(monitor=monitor)
    ram = "" if m.ram_gb is None else f"{m.ram_gb:.0f}"
    return f"{m.gpu_mem_gb:.0f}", m.gpu_source, ram, m.ram_source


@dataclass(frozen=True)
class EstimateShown:
    """What one browser's estimate shows (its gr.State)."""

    recommendation: str | None = None
    applicable: bool = False  # the Apply button is enabled
    table: str | None = None  # the rows and GPU size the table and chart were drawn from


class EstimatePanel(DerivedView):
    def __init__(self, ui: Registry, monitor):
        self.ui = ui
        self.default_gpu, self.default_source, self.default_ram, self.ram_source = default_machine(monitor)

    def build_advice(self) -> None:
        """GPU size, the recommendation and its Apply button (right column)."""
        add = self.ui.add
        with gr.Row(equal_height=True):
            self.gpu = add(
                "estimate.gpu",
                gr.Textbox(
                    value=self.default_gpu,
                    label="GPU memory per GPU",
                    info=f"GB (24, 80) or a GPU model (A100-40GB, H100, RTX 4090); {self.default_source}.",
                    elem_id="gpu-memory",
                    max_lines=1,
                    scale=3,
                ),
            )
            self.ram = add(
                "estimate.ram",
                gr.Textbox(
                    value=self.default_ram,
                    label="Host RAM per machine",
                    info=f"GB, for loading and CPU/NVMe offload; empty: not checked. {self.ram_source}.",
                    elem_id="host-ram",
                    max_lines=1,
                    scale=2,
                ),
            )
        self.apply = add(
            "estimate.apply",
            gr.Button("Apply recommendation", elem_id="apply-recommendation", interactive=False),
        )
        self.recommendation = add("estimate.recommendation", gr.Markdown(elem_id="recommendation"))
        self.shown = add("estimate.shown", gr.State(EstimateShown()))
        self.inputs = [self.gpu, self.ram]

    def build_details(self) -> None:
        """The table and the stacked bars, one per strategy (full width, under the form)."""
        with gr.Accordion("Memory per GPU for each strategy", open=True, elem_id="estimate-section"):
            with gr.Row():
                self.table = self.ui.add(
                    "estimate.table", gr.Dataframe(interactive=False, elem_id="estimate-table", wrap=True, scale=1)
                )
                self.figure = self.ui.add(
                    "estimate.chart", gr.Plot(show_label=False, elem_id="estimate-chart", scale=1)
                )

    @property
    def outputs(self) -> list:
        return [self.recommendation, self.apply, self.table, self.figure, self.shown]

    def context(self, got: Got) -> dict:
        return {"gpu_text": got[self.gpu], "ram_text": got[self.ram]}

    def update(self, result: JobResult, got: Got) -> Updates:
        old: EstimateShown = got[self.shown]
        advice = result.advice
        if result.spec is None or advice is None:
            shown = EstimateShown("Fix the errors above to see the memory estimate.", False, old.table)
            rows = headers = None
        else:
            headers, rows = estimate_table(advice)
            # Apply only when the advice changes fields (an unknown model or GPU: the markdown says which).
            applicable = not isinstance(advice, Unavailable) and bool(advice.recommendation.changes)
            # Same totals per strategy on the same GPU: the chart (the slow part) is unchanged.
            shown = EstimateShown(
                recommendation_markdown(advice), applicable, repr((rows, got[self.gpu], got[self.ram]))
            )
        out: Updates = {}
        if shown.recommendation != old.recommendation:
            out[self.recommendation] = shown.recommendation
        if shown.applicable != old.applicable:
            out[self.apply] = gr.update(interactive=shown.applicable)
        if shown.table != old.table:
            out.update({self.table: gr.update(value=rows, headers=headers), self.figure: estimate_figure(advice)})
        if shown != old:
            out[self.shown] = shown
        return out

    def apply_recommendation(self, spec, got: Got):
        """(strategy label, {dotted path: value}) of the recommendation for `spec` on the boxes' GPU and RAM."""
        advice = compute_advice(spec, got[self.gpu], got[self.ram])
        if isinstance(advice, Unavailable):
            raise ValueError(advice.text)
        return advice.recommendation.strategy, advice.recommendation.changes


def measured_vs_predicted(job: dict, peaks: dict) -> str:
    """For the run view: measured peak per rank beside the prediction for the run's job."""
    return measured_markdown(job, peaks)
