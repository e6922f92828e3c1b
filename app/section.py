"""A tab of the page (a Section) and what all tabs share (the Page).

A section builds its components inside its tab, registered under its own ids, wires its
own events, and may join the page-wide events that every browser sends once: the page
load and the tick (every TICK_S). The page merges the sections' updates into one response
for each, so ten tabs cost one request per tick, not ten. Adding a tab is a new
Section subclass and one line in page.py's SECTIONS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import gradio as gr

from tunedeck.app.registry import Got, Registry, Updates, handler, unique

TICK_S = 0.5  # a new metrics record reaches the page within a second (bench/bench_panel.py)

TickFn = Callable[[Got, str], Updates]  # (inputs, id of the section in view) -> updates


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
        self._tick: list[tuple[TickFn, list, list]] = []

    def build(self, sections: list[Section]) -> None:
        """The page's layout: the sections' tops, the notice, one tab per section, the timer."""
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
        self.timer = self.ui.add("page.timer", gr.Timer(TICK_S))

    # ------------------------------------------------------------ page-wide events

    def on_load(self, fn: Callable[[Got], Updates], inputs: Iterable, outputs: Iterable, **options) -> None:
        """Join the page load: `fn(got)` paints this section's first view."""
        for key, value in options.items():
            if self._load_options.setdefault(key, value) != value:
                raise ValueError(f"page load: sections ask for different {key}")
        self._load.append((fn, list(inputs), list(outputs)))

    def on_tick(self, fn: TickFn, inputs: Iterable, outputs: Iterable) -> None:
        """Join the timer (and tab changes): `fn(got, id of the tab in view)` returns what changed."""
        self._tick.append((fn, list(inputs), list(outputs)))

    def select(self, section_id: str) -> Updates:
        """Updates that bring a section's tab into view (for a handler with page.tabs among its outputs)."""
        return {self.tabs: gr.Tabs(selected=section_id), self.in_view: section_id}

    def wire(self, blocks: gr.Blocks, sections: list[Section]) -> None:
        """Wire every section, then the page-wide events they joined."""
        self.blocks = blocks  # for a section's own page-wide events (unload)
        for section in sections:
            section.wire(self)
        if self._load:

            def load(got: Got) -> Updates:
                return {k: v for fn, _, _ in self._load for k, v in fn(got).items()}

            blocks.load(
                handler(load),
                inputs={c for _, ins, _ in self._load for c in ins},
                outputs=unique(c for _, _, outs in self._load for c in outs),
                show_progress="hidden",
                **self._load_options,
            )
        tick_inputs = {self.in_view, *(c for _, ins, _ in self._tick for c in ins)}
        tick_outputs = unique(c for _, _, outs in self._tick for c in outs)

        def ticks(got: Got, in_view: str) -> Updates:
            return {k: v for fn, _, _ in self._tick for k, v in fn(got, in_view).items()}

        def tick(got: Got) -> Updates:
            return ticks(got, got[self.in_view])

        self.timer.tick(
            handler(tick),
            inputs=tick_inputs,
            outputs=tick_outputs,
            show_progress="hidden",
            trigger_mode="always_last",
        )
        for section in sections:  # a tab brought into view is drawn now, not at the next tick

            def shown(got: Got, section_id: str = section.id) -> Updates:
                return {self.in_view: section_id, **ticks(got, section_id)}

            tab = self.ui["page.tab." + section.id]
            tab.select(
                handler(shown), inputs=tick_inputs, outputs=[*tick_outputs, self.in_view], show_progress="hidden"
            )
