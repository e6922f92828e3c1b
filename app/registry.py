"""Every component the page's events read or write, under a stable id; events wired by name.

An id says where a component lives and what it is: `job.lora.r` (a form field: "job." and
its spec path), `job.start`, `estimate.apply`, `run.stop`, `monitor.gauges`, `page.notice`.
Listeners take their inputs as a set, so Gradio calls the handler with one dict
{component: value}, and handlers return {component: update} for only what changed (Gradio
6 leaves every other output as it is: blocks.py, convert_component_dict_to_list). Nothing
is wired by position, so adding an output never shifts another. The idea is LLaMA-Factory's
(webui/manager.py); tests and new tabs find a component by its id (`ui["run.stop"]`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import gradio as gr

from tunedeck.app.errors import shown_as_message

Component = Any  # a Gradio component or a gr.State
Got = dict  # what a listener receives: {component: the browser's value}
Updates = dict  # what a handler returns: {component: new value or gr.update(...)}


class Registry:
    def __init__(self) -> None:
        self._by_id: dict[str, Component] = {}

    def add(self, component_id: str, component: Component) -> Component:
        """Register `component` under `component_id` and return it (so building reads as one line)."""
        if component_id in self._by_id:
            raise ValueError(f"component id {component_id!r} is already taken")
        self._by_id[component_id] = component
        return component

    def __getitem__(self, component_id: str) -> Component:
        try:
            return self._by_id[component_id]
        except KeyError:
            near = [i for i in self._by_id if i.split(".")[0] == component_id.split(".")[0]]
            raise KeyError(
                f"no component {component_id!r}; ids here: {', '.join(near) or ', '.join(self._by_id)}"
            ) from None

    def __contains__(self, component_id: str) -> bool:
        return component_id in self._by_id

    def ids(self) -> list[str]:
        return list(self._by_id)

    def id_of(self, component: Component) -> str:
        return next(i for i, c in self._by_id.items() if c is component)

    def group(self, prefix: str) -> list[Component]:
        """The components whose id is `prefix` or starts with `prefix.` (in the order they were added)."""
        return [c for i, c in self._by_id.items() if i == prefix or i.startswith(prefix + ".")]

    def by_id(self, updates: Updates) -> dict[str, Any]:
        """{id: update} of a handler's result, for reading it (tests, logs)."""
        return {self.id_of(component): value for component, value in updates.items()}


def handler(fn: Callable[..., Updates]) -> Callable[..., Any]:
    """A listener's function: errors become messages (errors.py), and "nothing changed" (an empty
    dict, which Gradio would take as a value) is sent as gr.skip()."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        updates = fn(*args, **kwargs)
        return updates if updates else gr.skip()

    return shown_as_message(run)


def listen(triggers: Iterable, fn: Callable[..., Updates], inputs: Iterable, outputs: Iterable, **options):
    """Wire `fn(got) -> updates` to `triggers` (event listeners such as `button.click`), inputs by name;
    returns Gradio's dependency (for `.then`)."""
    return gr.on(list(triggers), handler(fn), inputs=set(inputs), outputs=unique(outputs), **options)


def unique(components: Iterable) -> list:
    """Each component once, in first-seen order (an output listed twice would be updated twice)."""
    seen: dict[int, Component] = {}
    for component in components:
        seen.setdefault(id(component), component)
    return list(seen.values())
