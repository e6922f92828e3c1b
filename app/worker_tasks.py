"""A worker's task (evaluate, merge) run in a thread beside the page's handler, its events as the page's progress
lines (app/after_view.py)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator


def in_background(task) -> Iterator[str]:
    """Run task(on_event) in a thread; yield a progress line per event; raise what it raised."""
    events: queue.Queue = queue.Queue()
    failure: list[BaseException] = []

    def run():
        try:
            task(events.put)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the handler's thread
            failure.append(exc)
        finally:
            events.put(None)

    threading.Thread(target=run, name="after-task", daemon=True).start()
    while (event := events.get()) is not None:
        line = progress_line(event)
        if line:
            yield line
    if failure:
        raise failure[0]


def progress_line(event: dict) -> str:
    """A worker's progress or warning event as one line of the page ("" for other events)."""
    if event.get("event") == "progress":
        return f"{event['stage']} ({event['done']}/{event['total']})"
    if event.get("event") == "warning":
        return f"⚠ {event['message']}"
    return ""
