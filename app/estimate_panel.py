"""The memory estimate beside the form: GPU size, recommendation, Apply, table and bar chart.

A DerivedView of the job: the job's evaluation (job_outputs.evaluate) compares the
strategies once per change into one Advice, and the text, the Apply button, the table and
the chart all read it, in the same handler as the files (no extra event chain). The
figures themselves come from app/estimate_view.py (pure builders).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from tunedeck.app.estimate_view import (
    HEADERS,
    ORDER_NOTE,
    Unavailable,
    column_widths,
    compute_advice,
    estimate_figure,
    estimate_table,
    measured_markdown,
    option_changes,
    option_choices,
    parse_price,
    recommendation_markdown,
    table_headers,
)
from tunedeck.app.job_events import DerivedView
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.estimate import Hardware, hardware_for, machine_facts
from tunedeck.backend.runs import Calibration, UnreadableJob, calibration
from tunedeck.backend.spec import JobSpec, gpu_row


@dataclass(frozen=True)
class EstimateShown:
    """What one browser's estimate shows (its gr.State)."""

    recommendation: str | None = None
    applicable: bool = False  # the Apply button is enabled
    table: str | None = None  # the rows and GPU size the table was drawn from
    chart: str | None = None  # the memory columns and GPU size the chart was drawn from (not the speed nor cost)


class EstimatePanel(DerivedView):
    def __init__(self, ui: Registry, monitor, runs_dir: Path | None = None):
        self.ui = ui
        self.machine = machine_facts(monitor=monitor)  # the facts `tunedeck validate` uses too
        self.runs_dir = runs_dir  # where finished runs are, to compare speed predictions with (backend/runs/speed.py)

    def build_advice(self) -> None:
        """GPU size, the recommendation and its Apply button (right column)."""
        add = self.ui.add
        with gr.Row(equal_height=True):
            self.gpu = add(
                "estimate.gpu",
                gr.Textbox(
                    value=self.own_gpu_text,
                    label="GPU memory per GPU",
                    info=f"GB (24, 80) or a GPU model (A100-40GB, H100, RTX 4090); {self.machine.gpu_source}.",
                    elem_id="gpu-memory",
                    max_lines=1,
                    scale=3,
                ),
            )
            self.ram = add(
                "estimate.ram",
                gr.Textbox(
                    value=self.own_ram_text,
                    label="Host RAM per machine",
                    info=f"GB, for loading and CPU/NVMe offload. {self.machine.ram_source[0].upper()}{self.machine.ram_source[1:]}.",
                    elem_id="host-ram",
                    max_lines=1,
                    scale=2,
                ),
            )
            self.price = add(  # a text box as the two above: every way a value reaches it counts (app/text_edits.py)
                "estimate.price",
                gr.Textbox(
                    value="",
                    label="Price per GPU-hour",
                    info="e.g. 2.5, any currency: the job's cost in the table and the speed line",
                    placeholder="none",
                    elem_id="gpu-price",
                    max_lines=1,
                    scale=2,
                ),
            )
        self.calibrate = add(
            "estimate.calibrate",
            gr.Checkbox(
                value=False,
                label="Correct the speed by my runs",
                info="multiplies predicted tokens/s by measured ÷ predicted of your last finished runs on this GPU",
                elem_id="calibrate-speed",
            ),
        )
        self.apply = add(
            "estimate.apply",
            gr.Button("Apply recommendation", elem_id="apply-recommendation", interactive=False),
        )
        self.recommendation = add("estimate.recommendation", gr.Markdown(elem_id="recommendation"))
        self.shown = add("estimate.shown", gr.State(EstimateShown()))
        self.inputs = [self.gpu, self.ram, self.price, self.calibrate]

    def build_details(self) -> None:
        """The table (full width: its headers never wrap letter by letter), a picker to apply any row,
        and the bars, one per strategy, under the form."""
        add = self.ui.add
        with gr.Accordion("Memory per GPU for each strategy", open=True, elem_id="estimate-section"):
            self.table = add(
                "estimate.table",
                gr.Dataframe(
                    headers=table_headers(priced=False),
                    interactive=False,
                    elem_id="estimate-table",
                    wrap=True,  # full width, so headers wrap at most at their words
                    column_widths=column_widths(table_headers(priced=False)),
                ),
            )
            add("estimate.order_note", gr.Markdown(ORDER_NOTE, elem_id="estimate-order"))
            with gr.Row(equal_height=False):
                self.pick = add(
                    "estimate.pick",
                    gr.Dropdown(
                        choices=[],
                        label="Apply another strategy",
                        info="any row of the table; it sets the fields that strategy needs",
                        elem_id="estimate-pick",
                        scale=3,
                    ),
                )
                self.apply_pick = add(
                    "estimate.apply_pick",
                    gr.Button("Apply this strategy", elem_id="apply-strategy", size="md", scale=1),
                )
            self.figure = add("estimate.chart", gr.Plot(show_label=False, elem_id="estimate-chart"))

    @property
    def outputs(self) -> list:
        return [self.recommendation, self.apply, self.table, self.figure, self.pick, self.shown]

    def context(self, got: Got) -> dict:
        """One scan of the runs folder per edit: the calibration corrects the speed (when ticked) and travels on
        the JobResult to the sentence under it."""
        found = self._calibration(got[self.gpu])
        hardware = self.hardware(got[self.gpu], got[self.price])
        if found and found.network_gbps and got[self.calibrate]:  # between machines: what your runs measured
            hardware = replace(hardware, measured_ring_gbps=found.network_gbps)
        return {
            "gpu_text": got[self.gpu],
            "ram_text": got[self.ram],
            "hardware": hardware,
            "calibration": found,
            "correction": found.factor if found and got[self.calibrate] else 1.0,
        }

    def hardware(self, gpu_text, price_text: str | None = None) -> Hardware:
        """The GPU speed is predicted on: the box's GPU model, or this machine's GPU (NVML) while the box
        holds this machine's size; else the assumed GPU, which the speed line says. With the price box's price
        (none while it is empty or not a price: price_markdown says why)."""
        try:
            price = parse_price(price_text)
        except ValueError:
            price = None
        name = self.machine.gpu_name
        if name and gpu_row(name) and str(gpu_text).strip() == self.own_gpu_text:
            return Hardware.named(name, price_per_gpu_hour=price)
        return hardware_for(gpu_text, price=price)

    @property
    def own_gpu_text(self) -> str:
        return f"{self.machine.gpu_mem_gb:.0f}"  # what the GPU box starts with

    @property
    def own_ram_text(self) -> str:
        return "" if self.machine.ram_gb is None else f"{self.machine.ram_gb:.0f}"  # what the RAM box starts with

    def _calibration(self, gpu_text) -> Calibration | None:
        """How your last finished runs on the box's GPU compared with their predictions (None: no such run)."""
        return None if self.runs_dir is None else calibration(self.runs_dir, self.hardware(gpu_text).gpu)

    def _correction(self, got: Got) -> float:
        found = self._calibration(got[self.gpu]) if got[self.calibrate] else None
        return found.factor if found else 1.0

    def price_markdown(self, got: Got) -> str:
        """Above the estimate: what is wrong with the price box's text, and what it takes."""
        try:
            parse_price(got[self.price])
        except ValueError as exc:
            said = as_text(exc)  # it quotes the typed text
            return f"✗ **Price per GPU-hour** (the box beside the GPU memory): {said}."
        return ""

    def calibration_markdown(self, found: Calibration | None, got: Got) -> str:
        """Under the speed line: your runs against the prediction, and whether the correction is on."""
        if found is None:
            if not got[self.calibrate]:
                return ""
            return "**Your runs:** no finished GPU run on this GPU to correct from yet; the prediction is uncorrected."
        text = as_text(found.sentence())
        text = text[0].upper() + text[1:]
        if got[self.calibrate]:
            return f"**Your runs:** {text}; the speed above is corrected by {found.factor:.2f}x."
        return f"**Your runs:** {text}. Tick *Correct the speed by my runs* to apply it."

    def update(self, result: JobResult, got: Got) -> Updates:
        old: EstimateShown = got[self.shown]
        advice = result.advice
        if result.spec is None or advice is None:
            shown = EstimateShown("Fix the errors above to see the memory estimate.", False, old.table, old.chart)
            rows = headers = None
        else:
            headers, rows = estimate_table(advice)
            # Apply only when the advice changes fields (an unknown model or GPU: the markdown says which).
            applicable = not isinstance(advice, Unavailable) and bool(advice.recommendation.changes)
            parts = (
                self.price_markdown(got),
                recommendation_markdown(advice),
                self.calibration_markdown(result.calibration, got),
            )
            text = "\n\n".join(t for t in parts if t)
            table = repr((headers, rows, got[self.gpu], got[self.ram]))
            # Same totals per strategy on the same GPU: the chart (the slow part) is unchanged by speed or price.
            chart = repr(([row[: len(HEADERS)] for row in rows], got[self.gpu], got[self.ram]))
            shown = EstimateShown(text, applicable, table, chart)
        out: Updates = {}
        if shown.recommendation != old.recommendation:
            out[self.recommendation] = shown.recommendation
        if shown.applicable != old.applicable:
            out[self.apply] = gr.update(interactive=shown.applicable)
        if shown.table != old.table and headers is not None:  # (a table only where there is advice)
            out[self.table] = gr.update(value=rows, headers=headers, column_widths=column_widths(headers))
        # The rows' labels are the picker's choices: a new price keeps the pick.
        if shown.chart != old.chart and advice is not None:
            out[self.figure] = estimate_figure(advice)
            out[self.pick] = gr.update(choices=option_choices(advice), value=None)
        if shown != old:
            out[self.shown] = shown
        return out

    def apply_option(self, spec, values: dict, got: Got):
        """(strategy label, {dotted path: value}) of the option picked below the table, for `spec`."""
        strategy = got[self.pick]
        if not strategy:
            raise ValueError("pick a strategy in the list first")
        advice = self._advice(spec, got)
        return strategy, option_changes(advice, strategy, values)

    def _advice(self, spec, got: Got):
        """The advice for `spec` on the boxes' GPU and RAM, or ValueError saying why there is none."""
        hardware = self.hardware(got[self.gpu], got[self.price])
        advice = compute_advice(spec, got[self.gpu], got[self.ram], hardware, correction=self._correction(got))
        if isinstance(advice, Unavailable):
            raise ValueError(advice.text)
        return advice

    def follow_preset(self, preset, got: Got) -> str:
        """Where no GPU is measured here, a preset sets the GPU and RAM boxes to the machine it is meant
        for (so its estimate, and its speed, read as on that machine), and a CPU preset (the demo, meant for this
        machine) puts this machine's back; says which in a sentence for the notice."""
        hw = preset.hardware
        if hw is None:
            return ""
        if not hw.gpus:  # a CPU job, meant for this machine: the boxes hold this machine's again
            own = (self.own_gpu_text, self.own_ram_text)
            moved = (str(got[self.gpu]).strip(), str(got[self.ram] or "").strip()) != own
            got[self.gpu], got[self.ram] = own
            return f"Meant for **{hw.label}**" + (": the GPU and RAM boxes are this machine's again." if moved else ".")
        if self.machine.has_gpu:
            return f"Meant for **{hw.label}**."
        gpu = hw.gpu if hw.gpu and gpu_row(hw.gpu) else f"{hw.gpu_mem_gb:g}"  # a name gives speed too; a size, memory
        got[self.gpu], got[self.ram] = gpu, f"{hw.ram_gb:g}"  # the fill writes them (job_view)
        return f"Meant for **{hw.label}**: the estimate below is for that machine."

    def apply_recommendation(self, spec, got: Got):
        """(strategy label, {dotted path: value}) of the recommendation for `spec` on the boxes' GPU and RAM."""
        advice = self._advice(spec, got)
        return advice.recommendation.strategy, advice.recommendation.changes


def measured_vs_predicted(job: JobSpec | UnreadableJob, peaks: dict) -> str:
    """For the run view: measured peak per rank beside the prediction for the run's job."""
    if isinstance(job, UnreadableJob):
        return f"(memory estimate unavailable: {as_text(job.explained())})"
    return measured_markdown(job, peaks)
