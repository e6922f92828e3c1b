"""What the Try · Evaluate · Export tab's handlers share: streaming with errors as messages, a view's updates as
component updates, and the one place an evaluation file may come from."""

from __future__ import annotations

import functools
import logging
import traceback
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from tunedeck.app.after_view import USER_ERRORS
from tunedeck.app.errors import user_message
from tunedeck.app.eval_display import answers_widths
from tunedeck.app.registry import Updates
from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.runs import AfterError

log = logging.getLogger("tunedeck.panel")


def streamed(fn):
    """handler() for generator listeners: each yielded {id: value} goes to the page; errors become messages."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            for updates in fn(*args, **kwargs):
                yield updates or gr.skip()
        except gr.Error:
            raise
        except USER_ERRORS as exc:
            raise gr.Error(as_html(exc), print_exception=False) from None  # a toast is HTML
        except Exception as exc:  # noqa: BLE001 - every handler error becomes a message
            log.error("handler %s failed:\n%s", fn.__name__, traceback.format_exc())
            raise gr.Error(as_html(user_message(exc)), print_exception=False) from None

    return run


def shown(ui, updates: dict) -> Updates:
    """A view's {id: value} for the components; the answers file becomes the download button's file."""
    if "after.answers" in updates:
        table = updates["after.answers"]
        updates["after.answers"] = gr.update(value=table, column_widths=answers_widths(len(table["headers"])))
    if "after.answers_file" in updates:
        path = updates.pop("after.answers_file")
        updates["after.answers_file"] = gr.update(value=path, interactive=bool(path))
    return {ui[k]: v for k, v in updates.items()}


def uploaded(path: str | None) -> str | None:
    """An evaluation file the page names: only where Gradio keeps this panel's uploads."""
    if not path:
        return None
    folder = Path(get_upload_folder()).resolve()
    if not Path(path).resolve().is_relative_to(folder):
        raise AfterError("Evaluation data: upload the file with the file box (the page reads no other path)")
    return path
