"""The live outputs beside the form: problems, global batch, file tabs, downloads, Start.

One handler recomputes everything from the form's values (job_outputs.evaluate) and
returns every output at once, so a change never cascades into a chain of events. A
per-session `shown` state remembers what the browser already has; unchanged outputs
are skipped, so typing in one box re-sends only what that box changed.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePath
from typing import Any, Callable

import gradio as gr

from app.downloads import BundleWriter, zip_name_for
from app.form import Form
from app.job_outputs import JobResult, batch_markdown, issues_markdown
from backend.fields import FORM_FIELDS, applies

LANGUAGES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sh": "shell", ".py": "python", ".md": "markdown"}


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def file_element_id(name: str) -> str:
    return "file-" + name.replace(".", "-").replace("_", "-")


class DerivedView:
    """Something else the page derives from the job (the memory estimate): outputs + update(result)."""

    outputs: list

    def update(self, result: JobResult) -> list:  # pragma: no cover - interface
        raise NotImplementedError


class JobView:
    def __init__(self, form: Form, file_names: list[str], writer: BundleWriter):
        self.form = form
        self.file_names = file_names
        self.writer = writer
        self.derived: list[DerivedView] = []

    # ------------------------------------------------------------ layout

    def build_status(self) -> None:
        """Problems, global batch, Start and the zip download (top of the right column)."""
        self.issues = gr.Markdown(elem_id="job-issues")
        self.batch = gr.Markdown(elem_id="global-batch")
        with gr.Row():
            self.start = gr.Button("▶ Start run", variant="primary", elem_id="start-run", interactive=False)
            self.zip = gr.DownloadButton("⬇ Download bundle (.zip)", elem_id="download-zip", interactive=False)

    def build_files(self) -> None:
        """One tab per generated file, then every file as its own download."""
        self.codes, self.tabs = [], []
        with gr.Tabs(elem_id="file-tabs"):
            for name in self.file_names:
                with gr.Tab(name, id=name, elem_id="tab-" + file_element_id(name)) as tab:
                    language = LANGUAGES.get(PurePath(name).suffix)
                    self.codes.append(
                        gr.Code(
                            language=language,
                            label=name,
                            interactive=False,
                            max_lines=40,
                            elem_id=file_element_id(name),
                            buttons=["copy", "download"],
                        )
                    )
                self.tabs.append(tab)
        with gr.Accordion("Download one file", open=False, elem_id="bundle-files-accordion"):
            self.files = gr.File(label="Each file alone", file_count="multiple", interactive=False, elem_id="bundle-files")
        self.shown = gr.State({})

    @property
    def outputs(self) -> list:
        extra = [c for view in self.derived for c in view.outputs]
        return [
            *self.form.components,
            *self.codes,
            *self.tabs,
            self.issues,
            self.batch,
            self.start,
            self.zip,
            self.files,
            self.shown,
            *extra,
        ]

    # ------------------------------------------------------------ updates

    def updates(self, result: JobResult, shown: dict, fill: bool) -> list:
        """Every output for `result`; `fill` also writes the values into the form (preset, upload)."""
        shown = dict(shown or {})
        out: list[Any] = []
        invalid = result.error_fields
        for field, component in zip(FORM_FIELDS, self.form.components):
            look = (applies(field.path, result.values) or field.path in invalid, field.path in invalid)
            if fill:
                out.append(
                    gr.update(
                        value=field.to_form(result.values[field.path]),
                        visible=look[0],
                        elem_classes=["invalid"] if look[1] else [],
                    )
                )
            elif shown.get(field.path) != look:
                out.append(gr.update(visible=look[0], elem_classes=["invalid"] if look[1] else []))
            else:
                out.append(gr.skip())
            shown[field.path] = look

        files = result.files
        for name in self.file_names:
            text = files.get(name)
            key = "file:" + name
            digest = _digest(text) if text is not None else None
            out.append(gr.skip() if shown.get(key) == digest else (text or ""))
            shown[key] = digest
        for name in self.file_names:
            visible = name in files or not files  # with no files (parse error) keep the tabs in place
            key = "tab:" + name
            out.append(gr.skip() if shown.get(key) == visible else gr.update(visible=visible))
            shown[key] = visible

        out.append(issues_markdown(result))
        out.append(batch_markdown(result.values))
        ok = not result.has_errors and result.spec is not None
        out.append(gr.update(interactive=ok))
        if ok and files:
            zip_path, paths = self.writer.write(files, zip_name_for(result.spec))
            if shown.get("zip") != str(zip_path):
                out += [gr.update(value=str(zip_path), interactive=True), [str(p) for p in paths]]
            else:
                out += [gr.skip(), gr.skip()]
            shown["zip"] = str(zip_path)
        else:  # an invalid job downloads nothing
            out += [gr.update(interactive=False), None]
            shown["zip"] = None
        out.append(shown)
        for view in self.derived:
            out += view.update(result)
        return out

    def wire(self, handler: Callable) -> None:
        """Any edit of any field -> one call of `handler(*values, shown)`."""
        gr.on(
            [c.input for c in self.form.components],
            handler,
            inputs=[*self.form.components, self.shown],
            outputs=self.outputs,
            trigger_mode="always_last",
            show_progress="hidden",
            queue=True,
        )
