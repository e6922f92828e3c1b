"""Errors become messages: no Python traceback ever reaches the page.

Every event handler is wrapped with `shown_as_message`. Errors people can act on
(a bad spec, a refused run) show their own message; anything else shows its type and
message and the traceback goes to the panel's console, where the operator looks.
"""

from __future__ import annotations

import functools
import logging
import traceback

import gradio as gr

log = logging.getLogger("tunedeck.panel")


def field_named(path: str) -> str:
    """A field as the page names it: its form label, with its key as a hint ("Learning rate
    (`training.learning_rate`)"); the key alone where the form has no such field (--runs-dir, this machine)."""
    from tunedeck.backend.fields import FIELDS_BY_PATH

    form_field = FIELDS_BY_PATH.get(path)
    return f"{form_field.label} (`{path}`)" if form_field is not None else (path or "job")


def user_message(exc: BaseException) -> str:
    """The text a person sees for an exception; a field it names is named by its label (field_named)."""
    from tunedeck.backend.spec import SpecError

    if isinstance(exc, SpecError):
        return "; ".join(f"{field_named(path)}: {msg}" for path, msg in exc.problems)
    problems = getattr(exc, "problems", None)  # Start's refusal (backend/preflight.py: refusal)
    if type(exc).__name__ == "RunError" and problems:
        from tunedeck.backend.preflight import refusal_text

        return refusal_text(problems, exc.head, field_named)
    if type(exc).__name__ == "RunError" or isinstance(exc, (ValueError, FileNotFoundError, PermissionError)):
        return str(exc)
    return f"Unexpected {type(exc).__name__}: {exc} (details are in the panel's console)"


def shown_as_message(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - every handler error becomes a message
            log.error("handler %s failed:\n%s", fn.__name__, traceback.format_exc())
            raise gr.Error(user_message(exc), print_exception=False) from None

    return wrapper
