"""The Try · Evaluate · Export tab over AfterView (app/after_view.py): the run and its weights, then its three
parts, each a module of its own layout and events (app/try_section.py, app/eval_section.py, app/export_section.py).

The run list is read again whenever the tab comes into view (a run that just saved a
checkpoint shows up). Answers, evaluations and merges stream their progress into the page
(generator handlers). Models live in worker processes: started on the first answer, ended
by the Release button, by this browser's tab closing (Blocks.unload), by their idle timeout
(TUNEDECK_WORKER_IDLE_S, default 900 s) and with the panel.
"""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr

from tunedeck.app.after_events import shown
from tunedeck.app.after_view import AfterView
from tunedeck.app.downloads import BundleWriter
from tunedeck.app.eval_section import ANSWERS_OUT, build_evaluate, wire_evaluate
from tunedeck.app.export_section import build_export, wire_export
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.app.section import Page, Section
from tunedeck.app.try_section import CHAT_ONLY, EXAMPLE_OUT, build_try, no_example, wire_try
from tunedeck.backend.after import DEFAULT_IDLE_TIMEOUT_S, WorkerPool

IDLE_ENV = "TUNEDECK_WORKER_IDLE_S"  # seconds a loaded model may sit unused before its worker ends
CSS = """
#after-answer textarea, #after-compare-answer textarea, #after-expected textarea { font-family: var(--font-mono); }
"""


def idle_timeout_s() -> float:
    raw = os.environ.get(IDLE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_IDLE_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{IDLE_ENV}: {raw!r} is not a number of seconds (e.g. 900)") from None
    if value <= 0:
        raise ValueError(f"{IDLE_ENV}: {raw!r} must be above 0 seconds")
    return value


class AfterTab(Section):
    id = "after"
    title = "Try · Evaluate · Export"

    def __init__(self, view: AfterView):
        self.view = view

    @classmethod
    def for_runs(cls, manager, work_dir: Path | None = None) -> AfterTab:
        """Its downloads go under the panel's `work_dir`, removed when the panel exits (app/cli_ui.py)."""
        answers = BundleWriter(work_dir and work_dir / "answers")
        return cls(AfterView(manager, WorkerPool(idle_timeout_s()), answers))

    def build(self, page: Page) -> None:
        add = page.ui.add
        with gr.Row():
            add("after.run", gr.Dropdown(label="Run", choices=[], elem_id="after-run", scale=3))
            add("after.weights", gr.Dropdown(label="Weights", choices=[], elem_id="after-weights", scale=2))
            add("after.compare", gr.Dropdown(label="Beside it", choices=[], elem_id="after-compare", scale=2))
        build_try(add)
        build_evaluate(add)
        build_export(add)

    # ------------------------------------------------------------ handlers (got: {component: value})

    def _choices(self, page: Page, run_id: str | None, show: str = "all") -> Updates:
        """The run's weights, comparisons and adapters, and its saved evaluation (its answers filtered by `show`)."""
        ui = page.ui
        if not run_id:
            hidden = {ui[i]: gr.update(visible=False) for i in CHAT_ONLY}
            return {
                **{ui[i]: gr.update(choices=[], value=None) for i in ("after.weights", "after.merge_weights")},
                **hidden,
            }
        weights = self.view.weights_choices(run_id)
        adapters = [c for c in weights if c[1] != "base"]
        chat = self.view.converses(run_id)
        return {
            **{ui[i]: gr.update(visible=chat) for i in CHAT_ONLY},
            ui["after.weights"]: gr.update(choices=weights, value=weights[0][1]),
            ui["after.compare"]: gr.update(choices=self.view.compare_choices(run_id), value="base"),
            ui["after.merge_weights"]: gr.update(choices=adapters, value=adapters[0][1] if adapters else None),
            **shown(ui, self.view.eval_view(run_id, show)),
        }

    def wire(self, page: Page) -> None:
        ui, view = page.ui, self.view
        run = ui["after.run"]

        def on_shown(got: Got) -> Updates:  # the tab came into view: runs may have been started or saved since
            runs = view.run_choices()
            ids = [r for _, r in runs]
            current = got[run] if got[run] in ids else (ids[0] if ids else None)
            status = {} if runs else {ui["after.status"]: "No run has saved an adapter yet: train one (Job tab)."}
            choices = self._choices(page, current, got[ui["after.answers_show"]] or "all")
            return {run: gr.update(choices=runs, value=current), **choices, **status}

        # Another run: the last merge's and export's status, serve.sh, Modelfile and example were the other one's.
        def on_run(got: Got) -> Updates:
            merged = {
                ui["after.merge_status"]: "",
                ui["after.serve"]: gr.update(value="", visible=False),
                ui["after.gguf_status"]: "",
                ui["after.modelfile"]: gr.update(value="", visible=False),
                ui["after.ollama_status"]: "",
                ui["after.ollama_create"]: gr.update(visible=False),
            }
            choices = self._choices(page, got[run], got[ui["after.answers_show"]] or "all")
            return {**choices, **merged, **no_example(ui)}

        picks = [
            "after.weights",
            "after.compare",
            "after.merge_weights",
            "after.eval_table",
            "after.eval_chart",
            "after.eval_status",
            *CHAT_ONLY,
            *ANSWERS_OUT,
        ]
        # Quick reads of the run's folder: no loading overlay over the boxes they fill.
        shown_out = [run, ui["after.status"], *map(ui.__getitem__, picks)]
        listen(
            [ui["page.tab." + self.id].select],
            on_shown,
            [run, ui["after.answers_show"]],
            shown_out,
            show_progress="hidden",
        )
        exported = (
            "after.merge_status",
            "after.serve",
            "after.gguf_status",
            "after.modelfile",
            "after.ollama_status",
            "after.ollama_create",
        )
        run_out = [ui[i] for i in (*picks, *exported, *EXAMPLE_OUT)]
        listen([run.input], on_run, [run, ui["after.answers_show"]], run_out, show_progress="hidden")

        wire_try(ui, view)
        wire_evaluate(ui, view)
        wire_export(ui, view)

        def on_unload(request: gr.Request) -> None:  # this browser tab closed: its models go, unless shared
            view.release_session(request.session_hash or "", shared_too=False)

        page.blocks.unload(on_unload)
