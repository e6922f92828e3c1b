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


def user_message(exc: BaseException) -> str:
    """The text a person sees for an exception."""
    from tunedeck.backend.spec import SpecError

    if isinstance(exc, SpecError):
        return "; ".join(f"{path or 'job'}: {msg}" for path, msg in exc.problems)
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
