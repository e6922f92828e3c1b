"""The bundle's downloads beside the form: ⬇ Download bundle (.zip) and each file alone (part of JobView).

The zip is made on click, of the job the form holds, and only while the files beside the form are that job's
(app/job_guard.py), as Start: a download between an edit and its files used to give the files of before the
edit. Each file alone follows the job with every edit (the files on display, written once per content).
"""

from __future__ import annotations

import gradio as gr

from tunedeck.app.downloads import BundleWriter, bundle_digest, zip_name_for
from tunedeck.app.errors import user_message
from tunedeck.app.job_events import JOB_QUEUE, JobShown
from tunedeck.app.job_guard import DOWNLOAD_JS, NotShownYet, spec_as_shown
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates, handler, listen, unique
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.render import DataPlan, carry, render_bundle
from tunedeck.backend.spec import SpecError


def downloaded(name: str, plan: DataPlan) -> str:
    """The notice after ⬇ Download: what the zip holds beyond the files shown."""
    said = f"Downloaded `{name}`: the files shown"
    if plan.carried:
        said += ", with the job's data in `data/` (its job.yaml reads it there)"
    if plan.left:
        said += "; its README.md lists what stays on this machine and where to copy it"
    return said + "."


class BundleDownloads:
    def __init__(self, ui: Registry, writer: BundleWriter):
        self.ui = ui
        self.writer = writer

    def build_button(self) -> None:
        """The zip button (in Start's row), and the hidden file its click fills for the page to download."""
        add = self.ui.add
        self.zip = add("job.zip", gr.Button("⬇ Download bundle (.zip)", elem_id="download-zip", interactive=False))
        self.zip_file = add("job.zip_file", gr.File(visible="hidden", elem_id="download-zip-file"))

    def build_files(self) -> None:
        with gr.Accordion("Download one file", open=False, elem_id="bundle-files-accordion"):
            self.files = self.ui.add(
                "job.file_downloads",
                gr.File(label="Each file alone", file_count="multiple", interactive=False, elem_id="bundle-files"),
            )

    @property
    def outputs(self) -> list:
        """What a job event may set here."""
        return [self.zip, self.files]

    def update(self, result: JobResult, shown: JobShown, out: Updates) -> None:
        """Each file alone follows the job; the zip button is enabled for a valid job."""
        old_zip = shown.zip
        if shown.startable and result.files:
            shown.zip = bundle_digest(result.files)  # the bundle on offer (its zip is made on click)
            if old_zip != shown.zip:
                out[self.files] = [str(p) for p in self.writer.write_files(result.files)]
            if old_zip is None:
                out[self.zip] = gr.update(interactive=True)
        else:  # an invalid job downloads nothing
            shown.zip = None
            if old_zip is not None:
                out[self.zip] = gr.update(interactive=False)
                out[self.files] = None

    def wire(self, view) -> None:
        """The zip button of `view` (the JobView): made on click, downloaded by the page (DOWNLOAD_JS); on a refusal
        the view recomputes the files from the form (JobView.recompute_if_refused)."""

        def on_download(got: Got) -> Updates:
            try:
                spec = spec_as_shown(view.form.raw(got), got[view.digest], got[view.shown], verb="Download")
            except (SpecError, NotShownYet) as exc:
                return {self.zip_file: None, view.notice: f"✗ **Not downloaded:** {user_message(exc, markdown=True)}"}
            files = render_bundle(spec)
            try:
                zip_path, _ = self.writer.write(files, zip_name_for(spec))
            except OSError as exc:  # a data file it carries went away, or the disk is full
                return {self.zip_file: None, view.notice: f"✗ **Not downloaded:** {as_text(exc)}"}
            return {self.zip_file: str(zip_path), view.notice: downloaded(zip_path.name, carry(files)[1])}

        listen(
            [self.zip.click],
            on_download,
            inputs=[*view.form.components, view.digest, view.shown],
            outputs=[self.zip_file, view.notice],
            show_progress="minimal",
            show_progress_on=[self.zip],
        ).then(None, inputs=[self.zip_file], js=DOWNLOAD_JS).then(
            handler(view.recompute_if_refused),
            inputs={*view.inputs, view.notice},
            outputs=unique(view.outputs),
            show_progress="hidden",
            **JOB_QUEUE,
        )
