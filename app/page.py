"""The page's layout: presets on top, then Job · Run · GPUs tabs. Wiring lives in the views."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from app.downloads import BundleWriter
from app.errors import shown_as_message
from app.form import build_form
from app.job_outputs import evaluate
from app.job_view import JobView
from backend.fields import FORM_FIELDS, values_from_form, values_from_spec
from backend.spec import JobSpec, Preset, load_presets, spec_from_yaml

# Presets in the order a newcomer reads them: the runnable demo, then growing model sizes.
PRESET_ORDER = ("demo", "7b-lora-ddp", "7b-full-zero2", "13b-lora-fsdp", "70b-qlora-zero3", "70b-qlora-fsdp")
UPLOAD_LIMIT_BYTES = 256 * 1024

CSS = """
#presets button { min-width: 0; }
.invalid input, .invalid textarea, .invalid .wrap { border-color: var(--error-border-color, #ef4444) !important; }
#job-issues { min-height: 2.5em; }
"""


def ordered_presets() -> list[Preset]:
    presets = load_presets()
    first = [presets[i] for i in PRESET_ORDER if i in presets]
    return first + [p for i, p in sorted(presets.items()) if i not in PRESET_ORDER]


def initial_file_names(spec: JobSpec) -> list[str]:
    from backend.render import render_bundle

    return list(render_bundle(spec))


def build_page(runs_dir: Path, preset_id: str | None = None) -> gr.Blocks:
    presets = ordered_presets()
    by_id = {p.id: p for p in presets}
    if preset_id is not None and preset_id not in by_id:
        raise ValueError(f"unknown preset {preset_id!r}; choose one of: {', '.join(by_id)}")
    initial_spec = by_id[preset_id].build() if preset_id else JobSpec()
    initial_values = values_from_spec(initial_spec)
    writer = BundleWriter()

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
                    with gr.Column(scale=1):
                        form = build_form({f.path: f.to_form(initial_values[f.path]) for f in FORM_FIELDS})
                    with gr.Column(scale=1):
                        job = JobView(form, initial_file_names(initial_spec), writer)
                        job.build_status()
                        job.build_files()

        @shown_as_message
        def on_form_change(*args):
            *raw, shown = args
            return job.updates(evaluate(values_from_form(raw)), shown, fill=False)

        def fill_with(spec: JobSpec, shown: dict, message: str) -> list:
            return [*job.updates(evaluate(values_from_spec(spec)), shown, fill=True), message]

        job.wire(on_form_change)
        for preset, button in zip(presets, preset_buttons):

            @shown_as_message
            def on_preset(shown, preset=preset):
                return fill_with(preset.build(), shown, f"Loaded preset **{preset.title}**: {preset.description}")

            button.click(on_preset, inputs=[job.shown], outputs=[*job.outputs, notice], show_progress="hidden")

        @shown_as_message
        def on_upload(path, shown):
            message, spec = read_uploaded_spec(path)
            if spec is None:
                return [*(gr.skip() for _ in job.outputs), message]
            return fill_with(spec, shown, message)

        upload.upload(on_upload, inputs=[upload, job.shown], outputs=[*job.outputs, notice], show_progress="hidden")

        @shown_as_message
        def on_load(*args):
            *raw, shown = args
            return job.updates(evaluate(values_from_form(raw)), {}, fill=False)

        page.load(on_load, inputs=[*form.components, job.shown], outputs=job.outputs, show_progress="hidden")
    page.tunedeck_css = CSS  # launch() takes css in Gradio 6
    page.main_tabs = main_tabs
    return page


def read_uploaded_spec(path: str | None) -> tuple[str, JobSpec | None]:
    """(message, spec or None): an invalid upload says what is wrong and changes nothing."""
    from backend.spec import SpecError

    if not path:
        return "No file received.", None
    file = Path(path)
    name = file.name
    if file.stat().st_size > UPLOAD_LIMIT_BYTES:
        return f"✗ **{name}** is larger than {UPLOAD_LIMIT_BYTES // 1024} KB; a job spec is a short YAML file.", None
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return f"✗ **{name}** is not a text file; upload a job.yaml.", None
    try:
        spec = spec_from_yaml(text)
    except SpecError as exc:
        lines = "\n".join(f"- `{p or 'job'}`: {m}" for p, m in exc.problems)
        return f"✗ **{name}** was not loaded; the form is unchanged:\n{lines}", None
    return f"Loaded **{name}**.", spec
