"""The live outputs beside the form: problems, global batch, file tabs, downloads, Start.

One handler recomputes everything from the form's values (job_outputs.evaluate, the
strategies compared once) and returns, by component, every output that changed, so a
change never cascades into a chain of events. A per-session JobShown (a gr.State)
remembers what the browser already has, so typing in one box re-sends only what that box
changed.

What the page shows is a function of its form, whatever order responses come in.
Gradio runs the events of different listeners at the same time, each with the values the
browser had when it fired, and the browser applies responses as they finish: on a fresh
panel the page-load handler (4-6 s) finished after a preset click and painted the default
job's files under the preset's form (7 of 20 fresh panels, issue 8). Three rules:

1. One queue. Every event that reads or writes the job outputs or JobShown (load, edits,
   presets, upload, Apply, the file strip) runs in one concurrency group of limit 1
   (JOB_QUEUE). Gradio 6.31 takes a group's events first in, first out, and frees the slot
   only after the response is on the session's message stream (gradio/queueing.py,
   process_events): responses reach the browser in the order they were computed, and each
   handler reads the JobShown its predecessor wrote. The group is shared by all sessions; one
   evaluation takes 0.05-0.3 s and a panel has few users.
2. Fill count. A fill (preset, upload, Apply) replaces the form, so an event fired before
   the browser applied it carries values the page no longer shows. The browser holds the
   number of fills it has applied (a hidden number set by each fill's response), JobShown the
   number sent; an edit or Apply whose count is behind is dropped whole (JobEvent.stale).
   The page load carries the oldest values of all: it paints only if nothing painted first.
3. Start compares. Start sends the digest of the files the browser shows (a hidden box set
   with the files) beside the form; the server renders the form's bundle and refuses on a
   mismatch, naming the fields it has not shown yet, and has them recomputed (app/job_guard.py).

Two kinds of events change fields for the person, and both are fills (rule 2): an edit whose
choice implies other fields (backend/spec/implied.py: choosing QLoRA sets 4-bit NF4) writes them
and says so in the notice, and a Fix button applies its problem's fix (Problem.fix).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import PurePath
from typing import Literal

import gradio as gr

from tunedeck.app.downloads import BundleWriter, bundle_digest
from tunedeck.app.form import Form
from tunedeck.app.form_marks import MAX_FIXES, field_looks, fix_choices, tab_labels
from tunedeck.app.job_downloads import BundleDownloads
from tunedeck.app.job_events import JOB_QUEUE, DerivedView, JobEvent, JobShown
from tunedeck.app.job_guard import RECOMPUTING
from tunedeck.app.job_outputs import JobResult, ThisMachine, batch_markdown, evaluate, issues_markdown
from tunedeck.app.registry import Got, Registry, Updates, listen
from tunedeck.app.untrusted_text import code_span
from tunedeck.backend.spec import (
    FORM_FIELDS,
    JobSpec,
    SpecError,
    describe,
    section_shown,
    set_paths,
    spec_from_values,
    spelled,
    values_from_form,
    values_from_spec,
    visible,
)
from tunedeck.backend.spec import apply_implied as implied

LANGUAGES: dict[str, Literal["yaml", "json", "shell", "python", "markdown"]] = {  # gr.Code's names
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".sh": "shell",
    ".sbatch": "shell",
    ".py": "python",
    ".md": "markdown",
}


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def language_of(name: str) -> Literal["yaml", "json", "shell", "python", "markdown"] | None:
    return LANGUAGES.get(PurePath(name).suffix)


class JobView:
    def __init__(self, ui: Registry, form: Form, file_names: list[str], writer: BundleWriter):
        self.ui = ui
        self.form = form
        self.file_names = file_names
        self.downloads = BundleDownloads(ui, writer)
        self.derived: list[DerivedView] = []
        self.notice = None  # the page's notice line (set before wire): says what an edit set for the person
        self.here: ThisMachine | None = None  # this machine's checks: what Start refuses on, shown live

    # ------------------------------------------------------------ layout

    def build_status(self) -> None:
        """Problems, global batch, Start and the zip download (top of the right column)."""
        add = self.ui.add
        self.issues = add("job.issues", gr.Markdown(elem_id="job-issues"))
        with add("job.fixes", gr.Row(elem_id="job-fixes", visible=False)) as self.fixes_row:
            self.fix_buttons = [
                add(f"job.fix.{i}", gr.Button("Fix", size="sm", visible=False, elem_id=f"fix-{i}", min_width=80))
                for i in range(MAX_FIXES)
            ]
        self.batch = add("job.batch", gr.Markdown(elem_id="global-batch"))
        with gr.Row():
            self.start = add(
                "job.start", gr.Button("▶ Start run", variant="primary", elem_id="start-run", interactive=False)
            )
            self.queue = add(  # Start after the live runs holding its GPUs (a CPU run: the CPU runs) have ended
                "job.queue", gr.Button("⇥ Queue", elem_id="queue-run", interactive=False, min_width=90)
            )
            self.smoke = add(  # the job's exact path on a tiny model, in about a minute (page.wire_start)
                "job.smoke", gr.Button("Smoke test", elem_id="smoke-run", interactive=False)
            )
            self.downloads.build_button()  # guarded as Start is (app/job_downloads.py)
        with gr.Accordion("Sweep: one run per value, queued one after another", open=False, elem_id="sweep"):
            self.vary = add(
                "job.vary",
                gr.Textbox(
                    label="Vary: a field per line, then = and its values",
                    placeholder="training.learning_rate=1e-4,2e-4\nlora.r=8,16",
                    lines=2,
                    elem_id="sweep-vary",
                ),
            )
            self.sweep_preview = add("job.sweep_preview", gr.Markdown(elem_id="sweep-preview"))
            self.sweep = add("job.sweep", gr.Button("⇥ Queue the sweep", elem_id="queue-sweep", interactive=False))
        # Rules 2 and 3 of the module docstring: what the browser has applied, sent back with every event.
        self.fills = add("job.fills", gr.Number(0, precision=0, visible=False, elem_id="job-fills"))
        self.digest = add("job.digest", gr.Textbox("", visible=False, elem_id="job-digest"))
        self.shown = add("job.shown", gr.State(JobShown()))

    def build_files(self) -> None:
        """A tab strip of the bundle's files (exactly the files of this job), one viewer, per-file downloads.

        The strip is a Radio: its choices follow the job (ds_config.json comes and goes with
        DeepSpeed), which Gradio's Tabs cannot do reliably once rendered.
        """
        add, first = self.ui.add, self.file_names[0]
        self.file_choice = add(
            "job.file_choice",
            gr.Radio(choices=self.file_names, value=first, show_label=False, elem_id="file-tabs", container=False),
        )
        self.code = add(
            "job.file_view",
            gr.Code(
                language=language_of(first),
                label=first,
                interactive=False,
                max_lines=45,
                elem_id="file-view",
                buttons=["copy", "download"],
            ),
        )
        self.downloads.build_files()

    @property
    def inputs(self) -> list:
        """What every job event reads: the form, what the browser shows and has applied, the derived views' controls."""
        return [*self.form.components, self.shown, self.fills, *self.extra_inputs, *(v.shown for v in self.derived)]

    @property
    def outputs(self) -> list:
        """Everything a job event may set; a fill also writes the form and the derived views' controls."""
        derived = [c for view in self.derived for c in view.outputs]
        own = [
            self.file_choice,
            self.code,
            self.issues,
            self.batch,
            self.start,
            self.queue,
            self.sweep,
            self.smoke,
            *self.downloads.outputs,
            self.shown,
            self.fills,
            self.fixes_row,
            *self.fix_buttons,
            *self.form.section_tabs.values(),
            *([self.notice] if self.notice is not None else []),
        ]
        return [*self.form.components, *own, self.digest, *self.extra_inputs, *derived]

    @property
    def extra_inputs(self) -> list:
        return [c for view in self.derived for c in view.inputs]

    def event(self, got: Got) -> JobEvent:
        return JobEvent(self.form.raw(got), got[self.shown], got[self.fills], got)

    # ------------------------------------------------------------ events (all in JOB_QUEUE)

    def on_edit(self, got: Got) -> Updates:
        """A field (or the GPU box) changed: recompute from the form, unless a fill made its values stale."""
        event = self.event(got)
        if event.stale:
            return {}
        values = values_from_form(event.raw)
        before = event.shown.values
        changed = {path for path, value in values.items() if before.get(path) != value} if before else set()
        values, applied = implied(values, changed)
        if not applied:
            return self.updates(self.evaluate(values, got), event, fill=False)
        try:  # the implied values go into the form like a fill (rule 2): what the widgets will hold
            spec = spec_from_values(values)
        except SpecError:  # another field does not parse yet: show the edit as it is
            return self.updates(self.evaluate(values_from_form(event.raw), got), event, fill=False)
        return {**self.on_fill(spec, event), self.notice: describe(applied)}

    def on_load(self, got: Got) -> Updates:
        """First paint of a new page: only if no other job event painted before it (rule 2)."""
        if got[self.shown].painted:
            return {}
        return self.on_edit(got)

    def on_fill(self, spec: JobSpec, event: JobEvent) -> Updates:
        """A preset, an upload or Apply: write `spec` into the form and everything derived from it.

        Derived from the values as the widgets will hold them, not from `spec` itself: a widget
        can round (a float box shows 6 digits), and Start runs what the widgets hold.
        """
        values = values_from_spec(spec)
        held = values_from_form([f.to_form(values[f.path]) for f in FORM_FIELDS])
        return self.updates(self.evaluate(held, event.got), event, fill=True)

    def show_file(self, got: Got) -> Updates:
        """The file strip: show the picked file of the bundle on display."""
        name, shown = got[self.file_choice], got[self.shown]
        text = shown.files.get(name, "")
        return {
            self.code: gr.update(value=text, language=language_of(name), label=name),
            self.shown: replace(shown, choice=name, code=(name, _digest(text))),
        }

    def evaluate(self, values, got: Got) -> JobResult:
        context = {key: value for view in self.derived for key, value in view.context(got).items()}
        return evaluate(values, here=self.here, **context)

    # ------------------------------------------------------------ what changed

    def updates(self, result: JobResult, event: JobEvent, fill: bool) -> Updates:
        """What differs from what the browser shows for `result`; `fill` also writes the form (preset, upload, Apply)."""
        old = event.shown
        shown = replace(old, painted=True, fills=old.fills + fill, looks={})
        out: Updates = {}
        looks = field_looks(result.issues)
        for f, component in zip(FORM_FIELDS, self.form.components):
            mark = looks[f.path]
            look = shown.looks[f.path] = (visible(f.path, result.values) or mark.level is not None, mark)
            change = {"value": f.to_form(result.values[f.path])} if fill else {}
            if fill or old.looks.get(f.path) != look:
                out[component] = gr.update(**change, visible=look[0], elem_classes=mark.classes, info=mark.info)
        shown.values = dict(result.values)
        self._mark_updates(result, shown, out)
        if result.files:  # with no files (the spec does not parse) the last ones stay in view
            self._file_updates(result.files, shown, out)
        shown.issues, shown.batch = issues_markdown(result), batch_markdown(result.values)
        shown.startable = not result.has_errors and result.spec is not None
        for component, key in ((self.issues, "issues"), (self.batch, "batch")):
            if getattr(old, key) != getattr(shown, key):
                out[component] = getattr(shown, key)
        if old.startable != shown.startable:
            for button in (self.start, self.queue, self.sweep, self.smoke):
                out[button] = gr.update(interactive=shown.startable)
        self.downloads.update(result, shown, out)
        if fill:
            out[self.fills] = shown.fills
            out.update({c: event.got[c] for c in self.extra_inputs})  # what the derived views were computed with
        for view in self.derived:
            out.update(view.update(result, event.got))
        if shown != old:
            out[self.shown] = shown
        return out

    def _mark_updates(self, result: JobResult, shown: JobShown, out: Updates) -> None:
        """The section tabs' problem counts and the Fix buttons, where they changed."""
        old_tabs, shown.tabs = shown.tabs, tab_labels(result.issues)
        old_shown, shown.tabs_shown = shown.tabs_shown, {t: section_shown(t, result.values) for t in shown.tabs}
        for title, tab in self.form.section_tabs.items():
            if old_tabs.get(title) != shown.tabs[title] or old_shown.get(title) != shown.tabs_shown[title]:
                out[tab] = gr.update(label=shown.tabs[title], visible=shown.tabs_shown[title])
        old_fixes, shown.fixes = shown.fixes, fix_choices(result.issues)
        if old_fixes != shown.fixes:
            out[self.fixes_row] = gr.update(visible=bool(shown.fixes))
            for index, button in enumerate(self.fix_buttons):
                label = shown.fixes[index][0] if index < len(shown.fixes) else "Fix"
                out[button] = gr.update(value=label, visible=index < len(shown.fixes))

    def fix(self, event: JobEvent, label: str) -> tuple[JobSpec | None, str]:
        """A Fix button: its problem's fix, applied to the form the person sees (a fill, rule 2)."""
        fixes = dict(event.shown.fixes)
        if event.stale or label not in fixes:  # the problems changed before the click arrived
            return None, "The problems changed before Fix arrived; read them again and press Fix again."
        changes = fixes[label]
        spec = set_paths(spec_from_values(values_from_form(event.raw)), changes)
        done = ", ".join(f"`{path}` → {code_span(spelled(value))}" for path, value in changes.items())
        return spec, f"Fixed: {done}."

    def _file_updates(self, files: dict[str, str], shown: JobShown, out: Updates) -> None:
        names = list(files)
        choice = shown.choice if shown.choice in names else names[0]
        if list(shown.files) != names:
            out[self.file_choice] = gr.update(choices=names, value=choice)
        code = (choice, _digest(files[choice]))
        if shown.code != code:
            out[self.code] = gr.update(value=files[choice], language=language_of(choice), label=choice)
        digest = bundle_digest(files)
        if shown.digest != digest:
            out[self.digest] = digest  # what Start compares with (rule 3)
        shown.files, shown.choice, shown.code, shown.digest = files, choice, code, digest

    def recompute_if_refused(self, got: Got) -> Updates:
        """After Start or Download refused for files not yet the form's: recompute them from the form now, so a
        second press works even if an edit never reached the server."""
        return self.on_edit(got) if RECOMPUTING in str(got[self.notice] or "") else {}

    # ------------------------------------------------------------ wiring

    def wire(self) -> None:
        """Edits of any field (or of a derived view's control) and the file strip; fills go through wire_fill."""
        listen(
            [c.input for c in [*self.form.components, *self.extra_inputs]],
            self.on_edit,
            inputs=self.inputs,
            outputs=self.outputs,
            trigger_mode="always_last",
            show_progress="hidden",
            **JOB_QUEUE,
        )
        self.downloads.wire(self)
        listen(
            [self.file_choice.input],
            self.show_file,
            inputs=[self.file_choice, self.shown],
            outputs=[self.code, self.shown],
            show_progress="hidden",
            **JOB_QUEUE,  # it writes JobShown too
        )

    def wire_fill(self, trigger, fill: Callable[[JobEvent], tuple[JobSpec | None, str]], notice, reads: tuple = ()):
        """`trigger` replaces the job with `fill(event)`'s spec and says its message in `notice`; returns Gradio's
        dependency (for `.then`).

        `fill` returns (spec, message), or (None, message) to change nothing; `reads` are the
        components it needs beyond the job's inputs (the upload).
        """

        def on_fill(got: Got) -> Updates:
            event = self.event(got)
            spec, message = fill(event)
            return {**(self.on_fill(spec, event) if spec is not None else {}), notice: message}

        on_fill.__name__ = getattr(fill, "__name__", "on_fill")  # the console names it when it fails
        outputs = [*self.outputs, notice]
        return listen(
            [trigger], on_fill, inputs=[*self.inputs, *reads], outputs=outputs, show_progress="hidden", **JOB_QUEUE
        )
