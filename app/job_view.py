"""The live outputs beside the form: problems, global batch, file tabs, downloads, Start.

One handler recomputes everything from the form's values (job_outputs.evaluate) and
returns every output at once, so a change never cascades into a chain of events. A
per-session `shown` state remembers what the browser already has; unchanged outputs
are skipped, so typing in one box re-sends only what that box changed.

What the page shows is a function of its form, whatever order responses come in.
Gradio runs the events of different listeners at the same time, each with the values the
browser had when it fired, and the browser applies responses as they finish: on a fresh
panel the page-load handler (4-6 s) finished after a preset click and painted the default
job's files under the preset's form (7 of 20 fresh panels, issue 8). Three rules:

1. One queue. Every event that reads or writes the job outputs or `shown` (load, edits,
   presets, upload, Apply, the file strip) runs in one concurrency group of limit 1
   (JOB_QUEUE). Gradio 6.31 takes a group's events first in, first out, and frees the slot
   only after the response is on the session's message stream (gradio/queueing.py,
   process_events): responses reach the browser in the order they were computed, and each
   handler reads the `shown` its predecessor wrote. The group is shared by all sessions; one
   evaluation takes 0.05-0.3 s and a panel has few users.
2. Fill count. A fill (preset, upload, Apply) replaces the form, so an event fired before
   the browser applied it carries values the page no longer shows. The browser holds the
   number of fills it has applied (a hidden number set by each fill's response), `shown` the
   number sent; an edit or Apply whose count is behind is dropped whole (JobEvent.stale).
   The page load carries the oldest values of all: it paints only if nothing painted first.
3. Start compares. Start sends the digest of the files the browser shows (a hidden box set
   with the files) beside the form; the server renders the form's bundle and refuses on a
   mismatch (JobView.spec_as_shown).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Callable

import gradio as gr

from tunedeck.app.downloads import BundleWriter, bundle_digest, zip_name_for
from tunedeck.app.form import Form
from tunedeck.app.job_outputs import JobResult, batch_markdown, evaluate, issues_markdown
from tunedeck.backend.fields import FORM_FIELDS, spec_from_values, values_from_form, values_from_spec, visible
from tunedeck.backend.render import render_bundle

# Rule 1 above: one first-in-first-out lane for every event that touches the job outputs.
JOB_QUEUE = {"concurrency_id": "job-view", "concurrency_limit": 1}

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


class NotShownYet(ValueError):
    """The files the browser shows are not those of its form (rule 3): nothing may run."""


@dataclass
class JobEvent:
    """A job event's inputs, in `JobView.inputs` order."""

    raw: list  # the form's widget values
    shown: dict  # the session's memo of what the browser has
    fills_seen: int  # the fills the browser had applied when the event fired
    extra: list  # the derived views' own controls (the GPU memory box)

    @property
    def stale(self) -> bool:
        """Fired before a fill that has been sent since: its form values are no longer on the page."""
        return int(self.fills_seen or 0) != self.shown.get("fills", 0)


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
        # Rules 2 and 3 of the module docstring: what the browser has applied, sent back with every event.
        self.fills = gr.Number(0, precision=0, visible=False, elem_id="job-fills")
        self.digest = gr.Textbox("", visible=False, elem_id="job-digest")

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
            self.show_file,
            inputs=[self.file_choice, self.shown],
            outputs=[self.code, self.shown],
            show_progress="hidden",
            **JOB_QUEUE,  # it writes `shown` too
        )

    def show_file(self, name: str, shown: dict) -> list:
        shown = dict(shown or {})
        text = (shown.get("files") or {}).get(name, "")
        shown.update(choice=name, code=(name, _digest(text)))
        return [gr.update(value=text, language=language_of(name), label=name), shown]

    @property
    def outputs(self) -> list:
        """Everything a job event may set; a fill also writes the form and the derived views' controls."""
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
            self.fills,
            self.digest,
            *self.extra_inputs,
            *extra,
        ]

    # ------------------------------------------------------------ updates

    @property
    def extra_inputs(self) -> list:
        return [c for view in self.derived for c in view.inputs]

    @property
    def inputs(self) -> list:
        """What every job event reads: the form, `shown`, the browser's fill count, the derived views' controls."""
        return [*self.form.components, self.shown, self.fills, *self.extra_inputs]

    def split(self, args) -> JobEvent:
        """Handler arguments in `inputs` order -> a JobEvent."""
        n = len(self.form.components)
        return JobEvent(list(args[:n]), dict(args[n] or {}), args[n + 1], list(args[n + 2 :]))

    def spec_as_shown(self, raw: list, shown_digest: str):
        """The form's job, if the files beside it show that same job (rule 3); for Start (and the like).

        Raises SpecError for an invalid form, NotShownYet while the page is still updating.
        """
        spec = spec_from_values(values_from_form(raw))
        if bundle_digest(render_bundle(spec)) != shown_digest:
            raise NotShownYet(
                "the files on the right were not yet those of the form (the page was still updating). "
                "Nothing was changed: check the files and press Start again."
            )
        return spec

    # ------------------------------------------------------------ events (all in JOB_QUEUE)

    def on_edit(self, event: JobEvent) -> list:
        """A field (or the GPU box) changed: recompute from the form, unless a fill made its values stale."""
        if event.stale:
            return self.unchanged()
        return self.updates(evaluate(values_from_form(event.raw)), event, fill=False)

    def on_load(self, event: JobEvent) -> list:
        """First paint of a new page: only if no other job event painted before it (rule 2)."""
        if event.shown.get("painted"):
            return self.unchanged()
        return self.on_edit(event)

    def on_fill(self, spec, event: JobEvent) -> list:
        """A preset, an upload or Apply: write `spec` into the form and everything derived from it.

        Derived from the values as the widgets will hold them, not from `spec` itself: a widget
        can round (a float box shows 6 digits), and Start runs what the widgets hold.
        """
        values = values_from_spec(spec)
        held = values_from_form([field.to_form(values[field.path]) for field in FORM_FIELDS])
        return self.updates(evaluate(held), event, fill=True)

    def unchanged(self) -> list:
        return [gr.skip() for _ in self.outputs]

    def updates(self, result: JobResult, event: JobEvent, fill: bool) -> list:
        """Every output for `result`; `fill` also writes the values into the form (preset, upload, Apply)."""
        shown = dict(event.shown)
        shown["painted"] = True
        if fill:
            shown["fills"] = shown.get("fills", 0) + 1
        out: list[Any] = []
        invalid = result.error_fields
        for field, component in zip(FORM_FIELDS, self.form.components):
            look = (visible(field.path, result.values) or field.path in invalid, field.path in invalid)
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
        shown_digest = bundle_digest(files) if files else gr.skip()  # what Start compares with (rule 3)

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
        out += [shown["fills"] if fill else gr.skip(), shown_digest]
        out += list(event.extra) if fill else [gr.skip() for _ in event.extra]  # what the estimate was computed with
        extra = list(event.extra)
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
            **JOB_QUEUE,
        )
