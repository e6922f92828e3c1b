"""The page: presets on top, then Job · Run · GPUs tabs, and the events that connect them.

Layout and wiring only; what each part shows is computed in job_view, run_view and
monitor_view. Every handler goes through errors.shown_as_message.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import gradio as gr

from tunedeck.app import monitor_view, run_view
from tunedeck.app.downloads import BundleWriter
from tunedeck.app.estimate_panel import EstimatePanel, measured_vs_predicted
from tunedeck.app.errors import shown_as_message, user_message
from tunedeck.app.form import build_form
from tunedeck.app.job_outputs import read_uploaded_spec
from tunedeck.app.job_view import JOB_QUEUE, JobView, NotShownYet
from tunedeck.app.monitor_view import MonitorView
from tunedeck.app.run_view import RunView
from tunedeck.backend.fields import FORM_FIELDS, spec_from_values, values_from_form, values_from_spec
from tunedeck.backend.monitor import shared_monitor
from tunedeck.backend.render import render_bundle
from tunedeck.backend.runs import RunError, RunManager
from tunedeck.backend.spec import JobSpec, Preset, SpecError, load_presets, set_paths

# Presets in the order a newcomer reads them: the runnable demo, then growing model sizes.
PRESET_ORDER = ("demo", "7b-lora-ddp", "7b-full-zero2", "13b-lora-fsdp", "70b-qlora-zero3", "70b-qlora-fsdp")
TICK_S = 1.0

CSS = """
#presets button { min-width: 0; }
.invalid input, .invalid textarea, .invalid .wrap { border-color: var(--error-border-color, #ef4444) !important; }
#job-issues { min-height: 2.5em; }
#file-tabs { gap: 4px; }
""" + monitor_view.CSS + run_view.CSS


def ordered_presets() -> list[Preset]:
    presets = load_presets()
    first = [presets[i] for i in PRESET_ORDER if i in presets]
    return first + [p for i, p in sorted(presets.items()) if i not in PRESET_ORDER]


def initial_file_names(spec: JobSpec) -> list[str]:
    return list(render_bundle(spec))


def build_page(runs_dir: Path, preset_id: str | None = None, work_dir: Path | None = None) -> gr.Blocks:
    """The page; downloads are written under `work_dir` (default: a temp folder of their own)."""
    presets = ordered_presets()
    by_id = {p.id: p for p in presets}
    if preset_id is not None and preset_id not in by_id:
        raise ValueError(f"unknown preset {preset_id!r}; choose one of: {', '.join(by_id)}")
    initial_spec = by_id[preset_id].build() if preset_id else JobSpec()
    initial_values = values_from_spec(initial_spec)
    runs = RunView(RunManager(runs_dir))
    monitor = MonitorView(shared_monitor())
    estimate = EstimatePanel(shared_monitor())
    runs.memory_hook = measured_vs_predicted

    with gr.Blocks(title="tunedeck") as page:
        gr.Markdown("## tunedeck · distributed fine-tuning control panel", elem_id="title")
        with gr.Row(elem_id="presets", equal_height=True):
            preset_buttons = [gr.Button(p.title, size="sm", elem_id="preset-" + p.id, min_width=100) for p in presets]
            upload = gr.UploadButton(
                "⬆ Upload job.yaml", file_types=[".yaml", ".yml"], size="sm", elem_id="upload-job", min_width=100
            )
        notice = gr.Markdown(elem_id="notice")
        with gr.Tabs(elem_id="main-tabs") as main_tabs:
            with gr.Tab("Job", id="job", elem_id="tab-job"):
                with gr.Row():
                    with gr.Column(scale=6):
                        form = build_form({f.path: f.to_form(initial_values[f.path]) for f in FORM_FIELDS})
                    with gr.Column(scale=5):
                        job = JobView(form, initial_file_names(initial_spec), BundleWriter(work_dir and work_dir / "bundles"))
                        job.build_status()
                        estimate.build_advice()
                        job.build_files()
                estimate.build_details()
                job.derived.append(estimate)
            with gr.Tab("Run", id="run", elem_id="tab-run") as run_tab:
                runs.build()
            with gr.Tab("GPUs", id="gpus", elem_id="tab-gpus"):
                monitor.build()
        timer = gr.Timer(TICK_S)
        monitor_seen = gr.State({"tab": "job", "sample": None})

        # ---------------------------------------------------------- job (ordering: see job_view's docstring)
        job.wire(shown_as_message(lambda *args: job.on_edit(job.split(args))))
        filled = dict(outputs=[*job.outputs, notice], show_progress="hidden", **JOB_QUEUE)
        for preset, button in zip(presets, preset_buttons):

            @shown_as_message
            def on_preset(*args, preset=preset):
                message = f"Loaded preset **{preset.title}**: {preset.description}"
                return [*job.on_fill(preset.build(), job.split(args)), message]

            button.click(on_preset, inputs=job.inputs, **filled)

        @shown_as_message
        def on_upload(path, *args):
            message, spec = read_uploaded_spec(path)
            if spec is None:
                return [*job.unchanged(), message]
            return [*job.on_fill(spec, job.split(args)), message]

        upload.upload(on_upload, inputs=[upload, *job.inputs], **filled)

        @shown_as_message
        def on_apply(*args):
            event = job.split(args)
            if event.stale:  # the advice the user saw was for a job the page has since replaced
                return [*job.unchanged(), "The job changed before Apply arrived; read the new advice and press Apply again."]
            spec = spec_from_values(values_from_form(event.raw))
            strategy, changes = estimate.recommended_changes(spec, *event.extra)
            if not changes:
                return [*job.unchanged(), "The job already follows the recommendation."]
            applied = ", ".join(f"`{path}` → `{value}`" for path, value in changes.items())
            return [*job.on_fill(set_paths(spec, changes), event), f"Applied **{strategy}**: {applied}."]

        estimate.apply.click(on_apply, inputs=job.inputs, **filled)

        # ---------------------------------------------------------- runs
        @shown_as_message
        def on_start(*args):
            *raw, shown_digest, view = args
            try:
                run_id, view = runs.start(job.spec_as_shown(raw, shown_digest), view)  # what the page shows runs
            except (SpecError, RunError, NotShownYet) as exc:
                return f"✗ **Not started:** {escape(user_message(exc))}", gr.skip(), gr.skip()
            return f"Started run `{run_id}`.", view, gr.Tabs(selected="run")

        job.start.click(
            on_start,
            inputs=[*form.components, job.digest, runs.view],
            outputs=[notice, runs.view, main_tabs],
            concurrency_limit=1,  # one launch at a time, whoever clicks
            show_progress="minimal",
            show_progress_on=[job.start],
        )
        runs.wire(notice, shown_as_message)
        run_tab.select(None, js=run_view.FOLLOW_LOG_JS)  # a log filled while the tab was hidden opens at its end

        # ---------------------------------------------------------- timer: the run, and the monitor when in view
        @shown_as_message
        def on_tick(view, smoothing, log_scale, overlay, seen):
            out = runs.render(view, smoothing, log_scale, overlay or None)
            if seen.get("tab") != "gpus":
                return [*out, gr.skip(), gr.skip(), seen]
            gauges, seen["sample"] = monitor.render(seen.get("sample"))
            return [*out, *gauges, seen]

        timer.tick(
            on_tick,
            inputs=[runs.view, *runs.chart_inputs, monitor_seen],
            outputs=[*runs.outputs, *monitor.outputs, monitor_seen],
            show_progress="hidden",
            trigger_mode="always_last",
        )

        def on_tab(seen, evt: gr.SelectData):
            seen = {**seen, "tab": {"GPUs": "gpus", "Run": "run"}.get(evt.value, "job"), "sample": None}
            if seen["tab"] != "gpus":
                return [gr.skip(), gr.skip(), seen]
            gauges, seen["sample"] = monitor.render(None)
            return [*gauges, seen]

        main_tabs.select(
            shown_as_message(on_tab), inputs=[monitor_seen], outputs=[*monitor.outputs, monitor_seen], show_progress="hidden"
        )

        # ---------------------------------------------------------- first paint, and re-attach to a live run
        @shown_as_message
        def on_load(*args):
            *job_args, view, smoothing, log_scale, overlay = args
            return [
                *job.on_load(job.split(job_args)),
                *runs.render(view, smoothing, log_scale, overlay or None, force=True),
            ]

        page.load(
            on_load,
            inputs=[*job.inputs, runs.view, *runs.chart_inputs],
            outputs=[*job.outputs, *runs.outputs],
            show_progress="hidden",
            **JOB_QUEUE,
        )
    page.tunedeck_css = CSS  # launch() takes css in Gradio 6
    return page
