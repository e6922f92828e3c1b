"""The memory estimate beside the form: GPU size, recommendation, Apply, table and bar chart.

A DerivedView of the job: it is recomputed in the same handler as the files (no extra
event chain), as one Advice that the text, the Apply button, the table and the chart all
read. The figures themselves come from app/estimate_view.py (pure builders).
"""

from __future__ import annotations

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

DEFAULT_GPU_GB = 80  # when this machine has no GPU to measure


def default_gpu_memory(monitor) -> tuple[str, str]:
    """(value, where it came from) for the GPU memory box: this machine's GPU when there is one."""
    gb = monitor.total_gpu_memory_gb()
    if gb is None:
        return str(DEFAULT_GPU_GB), f"no NVIDIA GPU here, so {DEFAULT_GPU_GB} GB is assumed"
    return f"{gb:.0f}", "from this machine's GPU (NVML)"


class EstimatePanel(DerivedView):
    def __init__(self, monitor):
        self.default_gpu, self.default_source = default_gpu_memory(monitor)

    def build_advice(self) -> None:
        """GPU size, the recommendation and its Apply button (right column)."""
        with gr.Row(equal_height=True):
            self.gpu = gr.Textbox(
                value=self.default_gpu,
                label="GPU memory per GPU",
                info=f"GB (24, 80) or a GPU model (A100-40GB, H100, RTX 4090); {self.default_source}.",
                elem_id="gpu-memory",
                max_lines=1,
                scale=3,
            )
            self.apply = gr.Button("Apply recommendation", elem_id="apply-recommendation", interactive=False, scale=1)
        self.recommendation = gr.Markdown(elem_id="recommendation")
        self.inputs = [self.gpu]

    def build_details(self) -> None:
        """The table and the stacked bars, one per strategy (full width, under the form)."""
        with gr.Accordion("Memory per GPU for each strategy", open=True, elem_id="estimate-section"):
            with gr.Row():
                self.table = gr.Dataframe(interactive=False, elem_id="estimate-table", wrap=True, scale=1)
                self.figure = gr.Plot(show_label=False, elem_id="estimate-chart", scale=1)

    @property
    def outputs(self) -> list:
        return [self.recommendation, self.apply, self.table, self.figure]

    def update(self, result: JobResult, shown: dict, gpu_text: str) -> list:
        spec = result.spec
        if spec is None:
            return ["Fix the errors above to see the memory estimate.", gr.update(interactive=False), gr.skip(), gr.skip()]
        advice = compute_advice(spec, gpu_text)
        headers, rows = estimate_table(advice)
        memo = repr((rows, gpu_text))  # same totals per strategy: the chart (the slow part) is unchanged
        unchanged, shown["estimate"] = shown.get("estimate") == memo, memo
        # Apply only when the advice changes fields (an unknown model or GPU: the markdown says which).
        applicable = not isinstance(advice, Unavailable) and bool(advice.recommendation.changes)
        return [
            recommendation_markdown(advice),
            gr.update(interactive=applicable),
            gr.skip() if unchanged else gr.update(value=rows, headers=headers),
            gr.skip() if unchanged else estimate_figure(advice),
        ]

    @staticmethod
    def recommended_changes(spec, gpu_text: str):
        """(strategy label, {dotted path: value}) the recommendation would apply."""
        advice = compute_advice(spec, gpu_text)
        if isinstance(advice, Unavailable):
            raise ValueError(advice.text)
        return advice.recommendation.strategy, advice.recommendation.changes


def measured_vs_predicted(job: dict, peaks: dict) -> str:
    """For the run view: measured peak per rank beside the prediction for the run's job."""
    return measured_markdown(job, peaks)
