"""Errors become messages: no Python traceback ever reaches the page.

Every event handler is wrapped with `shown_as_message`. Errors people can act on
(a bad spec, a refused run) show their own message; anything else shows its type and
message and the traceback goes to the panel's console, where the operator looks.
"""

from __future__ import annotations

import functools
import logging
import traceback
from dataclasses import replace

import gradio as gr

from tunedeck.app.untrusted_text import as_html, as_text

log = logging.getLogger("tunedeck.panel")


def field_named(path: str) -> str:
    """A field as the page names it: its form label, with its key as a hint ("Learning rate
    (`training.learning_rate`)"); the key alone where the form has no such field (--runs-dir, this machine)."""
    from tunedeck.backend.spec import FIELDS_BY_PATH

    form_field = FIELDS_BY_PATH.get(path)
    return f"{form_field.label} (`{path}`)" if form_field is not None else (path or "job")


def user_message(exc: BaseException, markdown: bool = False) -> str:
    """The text a person sees for an exception; a field it names is named by its label (field_named).

    `markdown`: for a Markdown surface (the page's notice): the exception's own words, which may quote the input,
    shown as text (app/untrusted_text.py) and the form's keys as code; else plain text (a toast escapes it as HTML).
    """
    from tunedeck.backend.spec import FIELDS_BY_PATH, SpecError

    if markdown and getattr(exc, "markdown", False):  # Markdown already, the input in code spans (app/job_guard.py)
        return str(exc)
    said = as_text if markdown else str

    def named(path: str) -> str:
        return field_named(path) if path in FIELDS_BY_PATH else said(path or "job")

    if isinstance(exc, SpecError):
        return "; ".join(f"{named(p.field)}: {said(p.message)}" for p in exc.problems)
    problems = getattr(exc, "problems", None)  # Start's refusal (backend/runs/preflight.py: refusal)
    if type(exc).__name__ == "RunError" and problems:
        from tunedeck.backend.runs import refusal_text

        problems = [replace(p, message=said(p.message)) for p in problems]
        head = getattr(exc, "head", None)
        return refusal_text(problems, head and said(head), named)
    if type(exc).__name__ == "RunError" or isinstance(exc, (ValueError, FileNotFoundError, PermissionError)):
        return said(str(exc))
    return said(f"Unexpected {type(exc).__name__}: {exc}") + " (details are in the panel's console)"


def shown_as_message(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - every handler error becomes a message
            log.error("handler %s failed:\n%s", fn.__name__, traceback.format_exc())
            # Gradio renders a toast's message as HTML: a column name in it must not draw a form or an image.
            raise gr.Error(as_html(user_message(exc)), print_exception=False) from None

    return wrapper
