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

LANGUAGES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".sh": "shell", ".sbatch": "shell", ".py": "python", ".md": "markdown"}


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def language_of(name: str) -> str | None:
    return LANGUAGES.get(PurePath(name).suffix)


class DerivedView:
    """Something else the page derives from the job (the memory estimate).

    `inputs` are its own controls (read with every job event), `outputs` what it shows;
    update(result, shown, *input values) returns one value per output (`shown` is the
    session's memo of what the browser has, to skip unchanged outputs).
    """

    inputs: list
    outputs: list

    def update(self, result: JobResult, shown: dict, *values) -> list:  # pragma: no cover - interface
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
        """A tab strip of the bundle's files (exactly the files of this job), one viewer, per-file downloads.

        The strip is a Radio: its choices follow the job (ds_config.json comes and goes with
        DeepSpeed), which Gradio's Tabs cannot do reliably once rendered.
        """
        self.file_choice = gr.Radio(
            choices=self.file_names, value=self.file_names[0], show_label=False, elem_id="file-tabs", container=False
        )
        self.code = gr.Code(
            language=language_of(self.file_names[0]),
            label=self.file_names[0],
            interactive=False,
            max_lines=45,
            elem_id="file-view",
            buttons=["copy", "download"],
        )
        with gr.Accordion("Download one file", open=False, elem_id="bundle-files-accordion"):
            self.files = gr.File(label="Each file alone", file_count="multiple", interactive=False, elem_id="bundle-files")
        self.shown = gr.State({})
        self.file_choice.input(
            self.show_file, inputs=[self.file_choice, self.shown], outputs=[self.code, self.shown], show_progress="hidden"
        )

    def show_file(self, name: str, shown: dict) -> list:
        shown = dict(shown or {})
        text = (shown.get("files") or {}).get(name, "")
        shown.update(choice=name, code=(name, _digest(text)))
        return [gr.update(value=text, language=language_of(name), label=name), shown]

    @property
    def outputs(self) -> list:
        extra = [c for view in self.derived for c in view.outputs]
        return [
            *self.form.components,
            self.file_choice,
            self.code,
            self.issues,
            self.batch,
            self.start,
            self.zip,
            self.files,
            self.shown,
            *extra,
        ]

    # ------------------------------------------------------------ updates

    @property
    def extra_inputs(self) -> list:
        return [c for view in self.derived for c in view.inputs]

    @property
    def inputs(self) -> list:
        """What every job event reads: the form, the session's `shown` state, the derived views' controls."""
        return [*self.form.components, self.shown, *self.extra_inputs]

    def split(self, args) -> tuple[list, dict, list]:
        """Handler arguments in `inputs` order -> (form values, shown, derived controls' values)."""
        n = len(self.form.components)
        return list(args[:n]), args[n], list(args[n + 1 :])

    def updates(self, result: JobResult, shown: dict, fill: bool, extra: list = ()) -> list:
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
        if files:  # with no files (the spec does not parse) the last ones stay in view
            names = list(files)
            choice = shown.get("choice") if shown.get("choice") in names else names[0]
            out.append(gr.skip() if shown.get("names") == names else gr.update(choices=names, value=choice))
            digest = _digest(files[choice])
            same = shown.get("code") == (choice, digest)
            out.append(gr.skip() if same else gr.update(value=files[choice], language=language_of(choice), label=choice))
            shown.update(names=names, choice=choice, code=(choice, digest), files=files)
        else:
            out += [gr.skip(), gr.skip()]

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
        out.append(shown)  # the same dict: derived views below still add their memo to it
        extra = list(extra)
        for view in self.derived:
            values, extra = extra[: len(view.inputs)], extra[len(view.inputs) :]
            out += view.update(result, shown, *values)
        return out

    def wire(self, handler: Callable) -> None:
        """Any edit of any field (or of a derived view's control) -> one call of `handler(*inputs)`."""
        gr.on(
            [c.input for c in [*self.form.components, *self.extra_inputs]],
            handler,
            inputs=self.inputs,
            outputs=self.outputs,
            trigger_mode="always_last",
            show_progress="hidden",
            queue=True,
        )
