"""Worker processes' streams beside the page's handler (app/after_view.py): a task (evaluate, merge) run in a thread,
its events as the page's progress lines, and answer streams run at once, side by side."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator


def in_background(task, bar: bool = False) -> Iterator[str]:
    """Run task(on_event) in a thread; yield a progress line per event (led by a bar of its steps when `bar`);
    raise what it raised."""
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
        if line and bar and event.get("event") == "progress":
            done, total = int(event["done"]), max(1, int(event["total"]))
            line = f"{'▰' * done}{'▱' * (total - done)} {line}"
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


def side_by_side(streams: dict[str, Iterator[str]], every_s: float | None = None) -> Iterator[dict[str, str]]:
    """Run answer streams at once (each worker answers in its own process); yield {name: text so far} per piece,
    and also every `every_s` seconds without one (so a caller can show progress while models load).

    A stream that fails ends with "[error: ...]" in its text; the others go on. Leaving early
    closes every stream, which cancels the answers still being generated.
    """
    pieces: queue.Queue = queue.Queue()
    leave = threading.Event()
    texts = dict.fromkeys(streams, "")

    def pump(name: str, stream: Iterator[str]) -> None:
        try:
            for piece in stream:
                if leave.is_set():
                    break
                pieces.put((name, piece))
        except Exception as exc:  # noqa: BLE001 - shown in that answer's text
            pieces.put((name, f"\n[error: {exc}]"))
        finally:
            close = getattr(stream, "close", None)
            if close:
                close()
            pieces.put((name, None))

    for name, stream in streams.items():
        threading.Thread(target=pump, args=(name, stream), name=f"answer-{name}", daemon=True).start()
    running = set(streams)
    try:
        while running:
            try:
                name, piece = pieces.get(timeout=every_s)
            except queue.Empty:
                yield dict(texts)
                continue
            if piece is None:
                running.discard(name)
                continue
            texts[name] += piece
            yield dict(texts)
    finally:
        leave.set()
