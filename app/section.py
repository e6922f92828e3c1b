"""A tab of the page (a Section) and what all tabs share (the Page).

A section builds its components inside its tab, registered under its own ids, wires its
own events, and may join the page load (the page merges the sections' updates into one
response) and have a timer of its own: it ticks every TICK_S while its tab is in view and is
still otherwise. Every tick costs the browser far more than its answer (at every event Gradio's
page looks up each component any event of the session has updated, and walks the subtree of each
container among them: 0.1-0.2 s of CPU per tick on this page), so a tab that does not tick costs
nothing, and no event updates a large container (page.py's SHOW_RUN_JS). Adding a tab is a new
Section subclass and one line in page.py's SECTIONS.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import gradio as gr

from tunedeck.app.registry import Got, Registry, Updates, handler, unique

TICK_S = 0.5  # the default; the Run tab ticks every 5 s, its progress bar streamed in between (app/live_progress.py)

TickFn = Callable[[Got, str], Updates]  # (inputs, id of the section in view) -> updates

# The page load as slow as a fresh panel's first one (4-6 s) on any page: the browser test of a preset clicked
# during the first load (tests/panel/test_browser_first_load.py) then races it on every page, not on some.
SLOW_LOAD_ENV = "TUNEDECK_SLOW_PAGE_LOAD_S"


def slow_load_s() -> float:
    raw = os.environ.get(SLOW_LOAD_ENV, "")
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        raise ValueError(f"{SLOW_LOAD_ENV}: {raw!r} is not a number of seconds (e.g. 4)") from None
    if value < 0:
        raise ValueError(f"{SLOW_LOAD_ENV}: {raw!r} must be 0 seconds or more")
    return value


class Section:
    """One tab. `id` is its tab id (the page can select it); `title` its label."""

    id: str
    title: str

    def build_top(self, page: Page) -> None:
        """Components above the tabs (the job's preset bar); most sections have none."""

    def build(self, page: Page) -> None:
        """Components inside the section's tab."""
        raise NotImplementedError

    def wire(self, page: Page) -> None:
        """Events, once every section is built (so a section can read another's ids)."""


class Page:
    """The registry, the notice line under the presets, the main tabs, and the page-wide events."""

    def __init__(self, ui: Registry):
        self.ui = ui
        self._load: list[tuple[Callable[[Got], Updates], list, list]] = []
        self._load_options: dict = {}
        self._tick: dict[str, tuple[TickFn, list, list]] = {}  # by section id
        self.timers: dict[str, gr.Timer] = {}  # by section id: the sections that tick

    def build(self, sections: list[Section]) -> None:
        """The page's layout: the sections' tops, the notice, one tab per section."""
        for section in sections:
            section.build_top(self)
        self.notice = self.ui.add("page.notice", gr.Markdown(elem_id="notice"))
        with self.ui.add("page.tabs", gr.Tabs(elem_id="main-tabs")) as self.tabs:
            for section in sections:
                with self.ui.add(
                    "page.tab." + section.id, gr.Tab(section.title, id=section.id, elem_id="tab-" + section.id)
                ):
                    section.build(self)
        self.in_view = self.ui.add("page.in_view", gr.State(sections[0].id))  # the tab this browser shows
        self._first = sections[0].id

    # ------------------------------------------------------------ page-wide events

    def on_load(self, fn: Callable[[Got], Updates], inputs: Iterable, outputs: Iterable, **options) -> None:
        """Join the page load: `fn(got)` paints this section's first view."""
        for key, value in options.items():
            if self._load_options.setdefault(key, value) != value:
                raise ValueError(f"page load: sections ask for different {key}")
        self._load.append((fn, list(inputs), list(outputs)))

    def on_tick(
        self, section_id: str, fn: TickFn, inputs: Iterable, outputs: Iterable, every_s: float = TICK_S
    ) -> None:
        """Give a section a timer, ticking every `every_s` while its tab is in view (and drawn when the tab is
        brought into view): `fn(got, id of the tab in view)` returns what changed."""
        timer = gr.Timer(every_s, active=section_id == self._first)
        self.timers[section_id] = self.ui.add("page.timer." + section_id, timer)
        self._tick[section_id] = (fn, list(inputs), list(outputs))

    def _in_view(self, section_id: str) -> Updates:
        timers = {timer: gr.Timer(active=owner == section_id) for owner, timer in self.timers.items()}
        return {self.in_view: section_id, **timers}

    def wire(self, blocks: gr.Blocks, sections: list[Section]) -> None:
        """Wire every section, then the page-wide events they joined."""
        self.blocks = blocks  # for a section's own page-wide events (unload)
        for section in sections:
            section.wire(self)
        if self._load:
            slow_s = slow_load_s()

            def load(got: Got) -> Updates:
                time.sleep(slow_s)  # with the values the browser had when the load fired, as a slow load has them
                return {k: v for fn, _, _ in self._load for k, v in fn(got).items()}

            blocks.load(
                handler(load),
                inputs={c for _, ins, _ in self._load for c in ins},
                outputs=unique(c for _, _, outs in self._load for c in outs),
                show_progress="hidden",
                **self._load_options,
            )
        for section_id, (fn, inputs, outputs) in self._tick.items():

            def tick(got: Got, fn: TickFn = fn) -> Updates:
                return fn(got, got[self.in_view])

            self.timers[section_id].tick(
                handler(tick),
                inputs={self.in_view, *inputs},
                outputs=outputs,
                show_progress="hidden",
                trigger_mode="always_last",
            )
        for section in sections:  # a tab brought into view is drawn now, not at the next tick
            fn, inputs, outputs = self._tick.get(section.id, (_draws_nothing, [], []))

            def shown(got: Got, section_id: str = section.id, fn: TickFn = fn) -> Updates:
                return {**self._in_view(section_id), **fn(got, section_id)}

            self.ui["page.tab." + section.id].select(
                handler(shown),
                inputs={self.in_view, *inputs},
                outputs=unique([*outputs, self.in_view, *self.timers.values()]),
                show_progress="hidden",
            )


def _draws_nothing(got: Got, in_view: str) -> Updates:
    return {}  # a section without a timer: selecting its tab only says it is in view
