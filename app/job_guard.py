"""Rule 3 of app/job_view.py: Start, Queue, the sweep and ⬇ Download take the job the form holds, and only while
the files beside the form are that job's.

The browser sends, with the form, the digest of the files it shows (a hidden box set with the files). A
mismatch means an edit's files are still on their way: nothing runs or downloads, the notice names the fields
whose values the files do not show yet, and the page recomputes the files from the form at once
(JobView.recompute_if_refused), so the second press works. It used to say "press Start again" for as long as
an edit that never reached the server (a paste, before app/text_edits.py) stayed unsent: forever.
"""

from __future__ import annotations

from tunedeck.app.downloads import bundle_digest
from tunedeck.app.job_events import JobShown
from tunedeck.app.untrusted_text import code_span
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import FIELDS_BY_PATH, JobSpec, Values, spec_from_values, spelled, values_from_form


class NotShownYet(ValueError):
    """The files the browser shows are not those of its form (rule 3): nothing may run."""

    markdown = True  # its message is Markdown, the form's values in code spans (app/errors.py: user_message)


RECOMPUTING = "they are brought up to date now"  # the refusal's words the page recomputes on (JobView)


def _code(value) -> str:
    """A form's value as code that nothing in it can end, cut at 60 characters."""
    return code_span(spelled(value), 60)


def not_shown_message(form: Values, computed: Values, verb: str) -> str:
    """Why Start (or Download) refused: the fields whose values the files beside the form do not show yet,
    by label, with the value they were made for and the form's. The page recomputes them at once, so the
    second press works (a refusal that repeats forever taught people nothing)."""
    changed = [path for path, value in form.items() if computed and computed.get(path, value) != value]
    if changed:
        named = "; ".join(
            f"{FIELDS_BY_PATH[path].label} (`{path}`: {_code(computed[path])} → {_code(form[path])})"
            for path in changed[:3]
        )
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        why = f"the files shown were made before your change to {named}{more}"
    else:
        why = "the files shown were not yet those of the form (the page was still updating)"
    return f"{why}. Nothing was changed; {RECOMPUTING}: check them and press {verb} again."


def spec_as_shown(raw: list, shown_digest: str, shown: JobShown | None = None, verb: str = "Start") -> JobSpec:
    """The form's job (its widget values `raw`), if the files beside it show that same job.

    Raises SpecError for an invalid form, NotShownYet while the page is still updating: its message names the
    fields whose values the files do not show yet (`shown.values`: what they were computed from).
    """
    values = values_from_form(raw)
    spec = spec_from_values(values)
    if bundle_digest(render_bundle(spec)) != shown_digest:
        raise NotShownYet(not_shown_message(values, shown.values if shown else {}, verb))
    return spec


# The zip a click on ⬇ Download made (a gr.File's value), downloaded as Gradio's DownloadButton does it.
DOWNLOAD_JS = """(file) => {
  if (!file || !file.url) return;
  const link = document.createElement('a');
  link.href = file.url;
  link.download = file.orig_name || 'tunedeck-bundle.zip';
  document.body.appendChild(link);
  link.click();
  link.remove();
}"""
