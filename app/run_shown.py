"""What one browser's Run tab shows, so that a redraw sends only what changed (app/run_view.py), and how often a
live run is redrawn."""

from __future__ import annotations

from dataclasses import dataclass, field

from tunedeck.app.registry import Updates

# The state line, charts and log follow a live run every TICK_S (each Gradio event costs the browser far more
# than its answer: an empty tick about 60 ms of Chromium's CPU); the progress bar follows it between ticks, and
# a change of state is shown at once: the bar's stream presses the hidden refresh button (app/live_progress.py).
TICK_S = 5.0
# Redrawing the two Plotly charts is the browser's largest cost after that (about half of the tab's on a
# synthetic live run: bench/bench_run_tab.py). A live run's new records redraw them at most every
# charts_every_s(age): at each tick in a run's first minutes, then less often as the run grows (a redraw adds a
# smaller share of the chart), every 30 s from its tenth minute, as TensorBoard reloads. A new run, an eval loss,
# an ended run or a changed chart option redraw them at once.
CHARTS_EVERY_S = TICK_S - 1  # under TICK_S: a timer's tick may come a little early
CHARTS_EVERY_MAX_S = 30.0
CHARTS_EVERY_SHARE = 0.05  # of the run's age


def charts_every_s(age_s: float) -> float:
    """How long a live run's charts stay as drawn, `age_s` seconds after it started."""
    return min(CHARTS_EVERY_MAX_S, max(CHARTS_EVERY_S, CHARTS_EVERY_SHARE * age_s))


@dataclass
class RunShown:
    """What one browser's Run tab shows (its gr.State); handlers work on a copy."""

    run: str | None = None  # the run in view
    follow: bool = True  # follow the live (else newest) run, until the user picks one
    runs_sig: tuple | None = None  # the run list the picker and the table were drawn from
    shown_run: str | None = None  # the run whose details are drawn
    notes_run: str | None = None  # the run whose name and notes are in their boxes
    sig: tuple | None = None  # what those details were drawn from
    charts_sig: tuple | None = None  # (chart options, data versions) the charts and memory were drawn from
    charts_at: float = 0.0  # when the charts were last drawn (time.monotonic() of the panel)
    log_sig: tuple | None = None  # what the log box was drawn from
    texts: dict = field(default_factory=dict)  # output id -> hash of what it shows (the detail outputs)
    bar_sig: tuple | None = None  # what the progress bar was drawn from: a live run's stream moves it in between

    def picked(self, run_id: str | None) -> RunShown:
        """What to show once the user picks `run_id` (none: follow the live run). Boxes that already hold its
        name and notes are kept: they may hold what the user began typing before this answer arrived."""
        run_id = run_id or None
        return RunShown(run=run_id, follow=not run_id, notes_run=self.notes_run if self.notes_run == run_id else None)

    def unchanged(self, out: Updates, outputs: list) -> None:
        """Drop from `out` the values among `outputs` that the browser already shows: each output sent costs the
        page its own update (Gradio's loading state and a redraw), even when its value is the same."""
        for component in outputs:
            if component in out:
                key, value = component._id, hash(repr(out[component]))
                if self.texts.get(key) == value:
                    del out[component]
                else:
                    self.texts[key] = value
