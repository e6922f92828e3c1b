"""The page's events through the functions Gradio calls: everything by name, one comparison per keystroke.

A listener is fired as Gradio fires it: with one dict {component: value} (the components'
current values, some replaced by id), and its answer read back by id.
"""

from __future__ import annotations

import gradio as gr
import pytest

import tunedeck.backend.estimate.advisor as advisor
from tunedeck.app.page import build_page
from tunedeck.app.registry import Registry


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    return build_page(tmp_path_factory.mktemp("runs"), preset_id="7b-lora-ddp")


def listener(blocks, component_id: str, trigger: str):
    target = blocks.tunedeck_ui[component_id]._id
    return next(fn for fn in blocks.fns.values() if any(t[0] == target and t[1] == trigger for t in fn.targets))


def fire(blocks, component_id: str, trigger: str, **values) -> dict:
    """Run the listener of `trigger` on `component_id` with the page's values, `values` (by id) replacing some."""
    ui = blocks.tunedeck_ui
    fn = listener(blocks, component_id, trigger)
    got = {c: c.value for c in fn.inputs}
    got.update({ui[i.replace("__", ".")]: v for i, v in values.items()})
    answer = fn.fn(got)
    return {} if answer == gr.skip() else ui.by_id(answer)  # a handler with nothing to change answers skip


@pytest.fixture
def comparisons(monkeypatch):
    """How many times the strategies were compared (advisor._compare: every Advice comes from one call)."""
    calls = []
    compare = advisor._compare
    monkeypatch.setattr(advisor, "_compare", lambda *a, **k: calls.append(a) or compare(*a, **k))
    return calls


def test_a_keystroke_compares_the_strategies_once(blocks, comparisons):
    first = fire(blocks, "job.lora.r", "input", job__lora__r=8)
    assert len(comparisons) == 1
    # That one comparison is what the recommendation, the table and the chart show.
    assert "Recommended" in first["estimate.recommendation"] or "Keep" in first["estimate.recommendation"]
    assert len(first["estimate.table"]["value"]) >= 4 and len(first["estimate.chart"].data) >= 4

    comparisons.clear()  # the next keystroke, from the browser that got the first answer
    second = fire(
        blocks, "job.lora.r", "input",
        job__lora__r=16, job__shown=first["job.shown"], estimate__shown=first["estimate.shown"],
    )  # fmt: skip
    assert len(comparisons) == 1
    assert "job.file_view" in second or "job.digest" in second  # the job changed: its bundle did


def test_a_preset_compares_the_strategies_once(blocks, comparisons):
    out = fire(blocks, "job.preset.70b-qlora-zero3", "click")
    assert len(comparisons) == 1
    assert out["job.method"]["value"] == "qlora" and "Loaded preset" in out["page.notice"]


def test_every_listener_reads_its_inputs_by_name(blocks):
    """Gradio passes a handler one dict when its inputs are a set: no listener depends on an order."""
    listeners = [fn for fn in blocks.fns.values() if fn.fn is not None]
    assert len(listeners) > 10
    positional = [fn.name for fn in listeners if not fn.inputs_as_dict and fn.inputs]  # unload takes no inputs
    assert positional == []


def test_a_tab_brought_into_view_is_drawn_and_remembered(blocks):
    out = fire(blocks, "page.tab.gpus", "select")
    assert out["page.in_view"] == "gpus" and "td-cards" in out["monitor.gauges"]  # drawn at once, not at the next tick
    away = fire(blocks, "page.tab.job", "select", monitor__shown=out["monitor.shown"])
    assert away["page.in_view"] == "job" and "monitor.gauges" not in away


def test_the_gpu_tab_redraws_only_for_a_new_sample_and_only_in_view():
    from dataclasses import replace

    from tunedeck.app.monitor_view import SPARK_EVERY_S, MonitorShown, MonitorView
    from tunedeck.app.section import Page
    from tunedeck.backend.machine.monitor import Monitor

    monitor = Monitor()  # not started: a sample exists only when this test takes one
    view = MonitorView(monitor)
    with gr.Blocks():
        view.build(Page(Registry()))
    monitor.sample_once()
    drawn = view.tick({view.shown: MonitorShown()}, "gpus")
    assert "CPU" in drawn[view.gauges] and drawn[view.shown].sample_time == monitor.latest().time
    assert view.tick({view.shown: drawn[view.shown]}, "gpus") == {}  # no new sample: nothing sent
    assert view.tick({view.shown: MonitorShown()}, "job") == {}  # out of view: nothing drawn
    monitor.sample_once()
    again = view.tick({view.shown: drawn[view.shown]}, "gpus")
    assert view.gauges in again and view.history not in again  # sparklines wait SPARK_EVERY_S
    monitor.sample_once()
    late = replace(again[view.shown], sparks_at=again[view.shown].sparks_at - SPARK_EVERY_S)
    assert view.history in view.tick({view.shown: late}, "gpus")
    away = view.tick({view.shown: late}, "job")
    assert away == {view.shown: MonitorShown()}  # back in view, gauges and sparklines are drawn at once


def test_components_have_stable_ids(blocks):
    ui = blocks.tunedeck_ui
    for component_id in (
        "job.lora.r",
        "job.strategy.kind",
        "job.start",
        "estimate.apply",
        "run.stop",
        "run.log",
        "page.notice",
    ):
        assert component_id in ui
    assert ui.id_of(ui["run.stop"]) == "run.stop"
    with pytest.raises(KeyError, match="run.stop"):
        ui["run.stopp"]  # a typo names the ids that exist
    fresh = Registry()
    fresh.add("run.stop", object())
    with pytest.raises(ValueError, match="already taken"):
        fresh.add("run.stop", object())


def test_a_new_tab_is_one_section(tmp_path):
    """How the after-training tabs will join: a Section builds, wires, and ticks while in view."""
    from tunedeck.app.section import Page, Section

    class Clock(Section):
        id, title = "clock", "Clock"

        def build(self, page):
            self.text = page.ui.add("clock.text", gr.Markdown())

        def wire(self, page):
            page.on_tick(
                self.id,
                lambda got, in_view: {self.text: "tick"} if in_view == self.id else {},
                inputs=[],
                outputs=[self.text],
            )

    class Home(Clock):
        id, title = "home", "Home"

        def build(self, page):
            page.ui.add("home.text", gr.Markdown("home"))

        def wire(self, page):
            pass

    page = Page(Registry())
    with gr.Blocks() as blocks:
        sections = [Home(), Clock()]
        page.build(sections)
        page.wire(blocks, sections)
    blocks.tunedeck_ui = page.ui
    assert "page.timer.home" not in page.ui  # a tab that draws nothing over time has no timer
    clock = page.ui["page.timer.clock"]
    assert clock.active is False  # the first tab is in view: the clock's timer is still
    assert fire(blocks, "page.timer.clock", "tick") == {}  # a late tick after leaving its tab draws nothing
    shown = fire(blocks, "page.tab.clock", "select")
    assert (shown["page.in_view"], shown["clock.text"], shown["page.timer.clock"].active) == ("clock", "tick", True)
    away = fire(blocks, "page.tab.home", "select")
    assert away["page.in_view"] == "home" and away["page.timer.clock"].active is False and "clock.text" not in away


def test_quiet_events_report_their_loading_status_to_one_component_not_to_their_outputs(blocks):
    """app/idle_costs.narrow_progress_targets: Gradio's page updates the loading status of every progress
    target of every event that ran, at each later event; a quiet event's targets would be its outputs."""
    from pathlib import Path

    config = blocks.get_config_file()
    quiet = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "quiet-events")
    events = [d for d in config["dependencies"] if d["backend_fn"]]
    hidden = [d for d in events if d["show_progress"] == "hidden"]
    assert len(hidden) >= 20 and all(d["show_progress_on"] == [quiet] for d in hidden)
    # The rest show progress on purpose, each on the button pressed (the dataset preview on its two outputs).
    assert all(len(d["show_progress_on"] or d["outputs"]) <= 2 for d in events if d not in hidden)
    # Gradio's page takes an event's progress targets from show_progress_on, else its outputs.
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    assert any("return this.show_progress_on||this.outputs" in f.read_text() for f in assets.glob("Blocks-*.js"))


def test_the_slowed_page_load_reads_its_seconds_and_names_a_bad_value(monkeypatch):
    from tunedeck.app.section import SLOW_LOAD_ENV, slow_load_s

    monkeypatch.delenv(SLOW_LOAD_ENV, raising=False)
    assert slow_load_s() == 0.0  # people's panels: the load as fast as it is
    monkeypatch.setenv(SLOW_LOAD_ENV, "4")
    assert slow_load_s() == 4.0
    for bad, said in (("soon", "is not a number of seconds"), ("-1", "must be 0 seconds or more")):
        monkeypatch.setenv(SLOW_LOAD_ENV, bad)
        with pytest.raises(ValueError, match=f"{SLOW_LOAD_ENV}: '{bad}' {said}"):
            slow_load_s()
