"""What the Try box holds between answers: each model's conversation, the example sent to it, the status line.

Plain values in, {component id: value} out, so the rules read (and test) without a page or a worker;
app/after_view.py calls them.
"""

from __future__ import annotations

import queue

from tunedeck.app.untrusted_text import as_text
from tunedeck.app.worker_tasks import progress_line
from tunedeck.backend.after import Example


def answer_status(events: queue.Queue, workers: dict, answered: dict, models: dict) -> str:
    """Take the workers' events: loading progress, then where each model runs; keep each answer's summary."""
    status = ""
    while not events.empty():
        event = events.get()
        if event.get("event") == "loaded":
            workers[event["key"]] = event["worker"]
        elif event.get("event") == "answered":
            answered[event["key"]] = event["summary"]
        elif not workers and progress_line(event):
            status = "loading: " + as_text(progress_line(event))  # it names the base model's path
    if workers:
        infos = [workers[key].info for key in models if key in workers]
        warnings = [i["warning"] for i in infos if i.get("warning")]
        status = as_text(", ".join(f"{i['description']} on {i['device']}" for i in infos))
        status += f" · ⚠ {as_text(warnings[0])}" if warnings else ""
    return status


def next_turns(history: dict[str, list], prompt: str, answers: dict[str, str], models) -> dict[str, list]:
    """Each model's conversation after this prompt: the turn added where a chat model answered; where a model
    failed, its conversation as it was (the next prompt goes on from there); none for a model without a template."""
    turns = {key: [*history.get(key, []), (prompt, text)] for key, text in answers.items()}
    return {**{key: list(history[key]) for key in models if key in history and key not in answers}, **turns}


def for_the_try_box(example: Example, conversing: bool) -> dict:
    sent = "**Answer** sends it as the run trained on it."
    if example.turns and not conversing:
        sent = "Keep the conversation is off: **Answer** sends its last message without the earlier turns."
    return {
        "after.prompt": example.prompt,
        "after.expected": example.expected,
        "after.example_note": f"{as_text(example.describe())}: {sent}",  # it names the data file
        "after.system": example.system,
        "turns": list(example.turns) if conversing else [],  # the conversation before the prompt
    }
