"""The Try · Evaluate · Export tab: the layout and events over AfterView (app/after_view.py).

The run list is read again whenever the tab comes into view (a run that just saved a
checkpoint shows up). Answers, evaluations and merges stream their progress into the page
(generator handlers). Models live in worker processes: started on the first answer, ended
by the Release button, by this browser's tab closing (Blocks.unload), by their idle timeout
(TUNEDECK_WORKER_IDLE_S, default 900 s) and with the panel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from tunedeck.app.after_events import shown, streamed
from tunedeck.app.after_view import USER_ERRORS, AfterView
from tunedeck.app.downloads import BundleWriter
from tunedeck.app.eval_section import ANSWERS_OUT, build_evaluate, wire_evaluate
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.app.section import Page, Section
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.after.prompting import MAX_NEW_TOKENS, transcript
from tunedeck.backend.after.worker_client import DEFAULT_IDLE_TIMEOUT_S, WorkerPool
from tunedeck.backend.runs.checkpoints import AfterError

IDLE_ENV = "TUNEDECK_WORKER_IDLE_S"  # seconds a loaded model may sit unused before its worker ends
DTYPES = ["bfloat16", "float16", "float32"]
EXAMPLE_OUT = ("after.example_prompt", "after.expected", "after.example_note")
CHAT_ONLY = ("after.system", "after.converse", "after.new_chat")  # shown for runs trained on conversations
TO_TRY_BOX_JS = "() => document.getElementById('after-prompt')?.scrollIntoView({block: 'center'})"
SETTINGS = ("max_new_tokens", "temperature", "top_p", "repetition_penalty", "stop")
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
        gr.Markdown("### Try", elem_id="after-try-title")
        add("after.system", gr.Textbox(label="System message (sent first, through the chat template)", lines=1,
                                       visible=False, placeholder="none: the model's own default, if its template has one",
                                       elem_id="after-system"))  # fmt: skip
        with gr.Row():
            add(
                "after.prompt",
                gr.Textbox(label="Prompt (Shift+Enter answers)", lines=3, elem_id="after-prompt", scale=4),
            )
            with gr.Column(scale=1, min_width=160):
                add("after.ask", gr.Button("Answer", variant="primary", elem_id="after-ask"))
                add("after.example", gr.Button("Example from the data", elem_id="after-example"))
                add("after.release", gr.Button("Release models", elem_id="after-release"))
        with gr.Row():
            add("after.converse", gr.Checkbox(True, label="Keep the conversation", visible=False, scale=4,
                                              info="a chat run: each answer sees the earlier turns, shown above it",
                                              elem_id="after-converse"))  # fmt: skip
            add("after.new_chat", gr.Button("New conversation", visible=False, scale=1, elem_id="after-new-chat"))
        add("after.example_note", gr.Markdown(elem_id="after-example-note"))
        add("after.example_prompt", gr.State(None))  # the example's prompt: its answer is judged while it is unchanged
        add("after.history", gr.State(None))  # {"with": (run, weights, beside), "turns": {answer box id: turns}}
        with gr.Accordion("Generation settings", open=False, elem_id="after-settings"):
            with gr.Row():
                add("after.max_new_tokens", gr.Number(64, label="max new tokens", precision=0, minimum=1,
                                                      maximum=MAX_NEW_TOKENS, elem_id="after-max-new-tokens"))  # fmt: skip
                add("after.temperature", gr.Slider(0, 2, 0, step=0.05, label="temperature (0 = greedy)"))
                add("after.top_p", gr.Slider(0.05, 1, 1, step=0.05, label="top-p"))
                add("after.repetition_penalty", gr.Number(1.0, label="repetition penalty (1 = off)"))
                add("after.stop", gr.Textbox(label="stop strings (one per line)", lines=2, elem_id="after-stop"))
        with gr.Row():
            add("after.answer", gr.Textbox(label="Answer", lines=6, interactive=False, elem_id="after-answer"))
            add("after.compare_answer", gr.Textbox(label="Beside it", lines=6, interactive=False,
                                                   elem_id="after-compare-answer"))  # fmt: skip
            add("after.expected", gr.Textbox(label="The data's answer", lines=6, interactive=False, visible=False,
                                             elem_id="after-expected"))  # fmt: skip
        add("after.status", gr.Markdown(elem_id="after-status"))

        build_evaluate(add)

        gr.Markdown(
            "### Export\nMerges the adapter into the base and saves a standalone model under the run folder "
            "(`<run>/merged/<name>/`), with `serve.sh` for vLLM. A QLoRA adapter is merged into the base loaded "
            "in 16 bit (or the dtype you pick), never into its 4-bit weights, so the merged model needs no bitsandbytes.",
            elem_id="after-export-title",
        )
        with gr.Row():
            add("after.merge_weights", gr.Dropdown(label="Adapter", choices=[], elem_id="after-merge-weights"))
            add("after.merge_dtype", gr.Dropdown(DTYPES, value="bfloat16", label="dtype", elem_id="after-merge-dtype"))
            add("after.merge_name", gr.Textbox("model", label="folder name (under <run>/merged/)",
                                               elem_id="after-merge-name"))  # fmt: skip
            add("after.merge", gr.Button("Merge", variant="primary", elem_id="after-merge"))
        add("after.merge_status", gr.Markdown(elem_id="after-merge-status"))
        add(
            "after.serve",
            gr.Code(label="serve.sh", language="shell", interactive=False, visible=False, elem_id="after-serve"),
        )  # shown once a merge wrote serve.sh
        with gr.Row():
            add("after.repo_id", gr.Textbox(label="Hub repo id (user/name)", elem_id="after-repo-id"))
            add("after.token", gr.Textbox(label="Hub token (write access)", type="password", elem_id="after-token"))
            add("after.push", gr.Button("Push to the Hub", elem_id="after-push"))

    # ------------------------------------------------------------ handlers (got: {component: value})

    def _choices(self, page: Page, run_id: str | None, show: str = "all") -> Updates:
        """The run's weights, comparisons and adapters, and its saved evaluation (its answers filtered by `show`)."""
        ui = page.ui
        if not run_id:
            hidden = {ui[i]: gr.update(visible=False) for i in CHAT_ONLY}
            return {**{ui[i]: gr.update(choices=[], value=None) for i in ("after.weights", "after.merge_weights")},
                    **hidden}  # fmt: skip
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

    @staticmethod
    def _no_example(page: Page) -> Updates:
        ui = page.ui
        return {
            ui["after.example_prompt"]: None,
            ui["after.expected"]: gr.update(value="", visible=False),
            ui["after.example_note"]: "",
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

        def on_run(
            got: Got,
        ) -> Updates:  # another run: the last merge's status, serve.sh and example were the other one's
            merged = {ui["after.merge_status"]: "", ui["after.serve"]: gr.update(value="", visible=False)}
            choices = self._choices(page, got[run], got[ui["after.answers_show"]] or "all")
            return {**choices, **merged, **self._no_example(page)}

        picks = ["after.weights", "after.compare", "after.merge_weights", "after.eval_table", "after.eval_chart",
                 "after.eval_status", *CHAT_ONLY, *ANSWERS_OUT]  # fmt: skip
        # Quick reads of the run's folder: no loading overlay over the boxes they fill.
        shown_out = [run, ui["after.status"], *map(ui.__getitem__, picks)]
        listen([ui["page.tab." + self.id].select], on_shown, [run, ui["after.answers_show"]], shown_out,
               show_progress="hidden")  # fmt: skip
        run_out = [ui[i] for i in (*picks, "after.merge_status", "after.serve", *EXAMPLE_OUT)]
        listen([run.input], on_run, [run, ui["after.answers_show"]], run_out, show_progress="hidden")

        answer_in = ["after.run", "after.weights", "after.compare", "after.prompt", *("after." + s for s in SETTINGS),
                     "after.example_prompt", "after.expected", "after.converse", "after.history", "after.system"]  # fmt: skip

        @streamed
        def on_answer(got: Got, request: gr.Request) -> Iterator[Updates]:
            value = {i: got[ui[i]] for i in answer_in}
            settings = {s: value["after." + s] for s in SETTINGS}
            settings["stop"] = [line for line in (settings["stop"] or "").splitlines() if line]
            prompt = value["after.prompt"] or ""
            example = value["after.example_prompt"]
            from_example = prompt == example  # an edited example has no known answer
            expected = value["after.expected"] if from_example and value["after.expected"] else None
            left = {} if from_example or example is None else self._no_example(page)
            args = (value["after.run"], value["after.weights"], value["after.compare"] or "", prompt)
            # A conversation goes on while the same models answer; other models start a new one.
            history = value["after.history"] or {}
            chat = view.converses(args[0])
            conversing = bool(value["after.converse"]) and chat
            turns = history.get("turns", {}) if tuple(history.get("with", ())) == args[:3] else {}
            yield {ui["after.answer"]: "", ui["after.compare_answer"]: "", ui["after.status"]: "", **left}
            for updates in view.answer(*args, settings, session=request.session_hash, expected=expected,
                                       history=turns if conversing else None,
                                       system=(value["after.system"] or "") if chat else ""):  # fmt: skip
                if "after.history" in updates:  # answered: the prompt now shows in the conversation, the box is free
                    updates.update({"after.history": {"with": args[:3], "turns": updates["after.history"]},
                                    "after.prompt": ""})  # fmt: skip
                yield {ui[k]: v for k, v in updates.items()}

        gr.on([ui["after.ask"].click, ui["after.prompt"].submit], on_answer, inputs={ui[i] for i in answer_in},
              outputs=[ui[i] for i in ("after.answer", "after.compare_answer", "after.status", "after.prompt",
                                       "after.history", *EXAMPLE_OUT)],
              concurrency_limit=4,
              trigger_mode="once",  # a second click while answering is ignored: the models answer one prompt at a time
              show_progress="minimal", show_progress_on=[ui["after.ask"]])  # fmt: skip

        example_in = [run, *(ui[i] for i in ("after.weights", "after.compare", "after.converse"))]

        def on_example(got: Got, number: int | None = None) -> Updates:
            try:
                conversing = bool(got[ui["after.converse"]])
                if number is None:
                    found = view.example(got[run], conversing=conversing)
                else:
                    found = view.evaluated_example(got[run], number, conversing)
            except USER_ERRORS as exc:  # no run, or data without a prompt and answer: said where the example goes
                return {**self._no_example(page), ui["after.example_note"]: f"✗ {as_text(exc)}"}
            # The example is a conversation of its own: its earlier turns (if any) are each model's history.
            args = (got[run], got[ui["after.weights"]], got[ui["after.compare"]] or "")
            boxes = ("after.answer", "after.compare_answer") if args[2] else ("after.answer",)
            shown = transcript(found["turns"])
            return {
                ui["after.prompt"]: found["after.prompt"],
                ui["after.example_prompt"]: found["after.prompt"],
                ui["after.expected"]: gr.update(
                    value=found["after.expected"] or "", visible=found["after.expected"] is not None
                ),
                ui["after.example_note"]: found["after.example_note"],
                ui["after.system"]: found["after.system"],
                ui["after.history"]: {"with": args, "turns": dict.fromkeys(boxes, found["turns"])},
                ui["after.answer"]: shown,
                ui["after.compare_answer"]: shown if args[2] else "",
                ui["after.status"]: "",
            }

        example_out = ("after.prompt", *EXAMPLE_OUT, "after.system", "after.history", "after.answer",
                       "after.compare_answer", "after.status")  # fmt: skip
        listen([ui["after.example"].click], on_example, example_in, [ui[i] for i in example_out],
               show_progress="minimal", show_progress_on=[ui["after.example"]])  # fmt: skip

        def on_answers_row(got: Got, picked: gr.SelectData) -> Updates:  # a row of the answers: into the Try box
            return on_example(got, int(picked.row_value[0])) if picked.row_value else {}

        listen([ui["after.answers"].select], on_answers_row, example_in, [ui[i] for i in example_out],
               show_progress="hidden").then(None, js=TO_TRY_BOX_JS)  # fmt: skip

        def on_new_chat(got: Got) -> Updates:
            cleared = {ui[i]: "" for i in ("after.answer", "after.compare_answer", "after.status")}
            return {ui["after.history"]: None, **cleared}

        new_chat_out = [ui[i] for i in ("after.history", "after.answer", "after.compare_answer", "after.status")]
        listen([ui["after.new_chat"].click], on_new_chat, [], new_chat_out, show_progress="hidden")

        def on_release(got: Got, request: gr.Request) -> Updates:
            return {ui[k]: v for k, v in view.release_session(request.session_hash).items()}

        listen([ui["after.release"].click], on_release, [run], [ui["after.status"]])

        wire_evaluate(ui, view)

        @streamed
        def on_merge(got: Got) -> Iterator[Updates]:
            args = [got[ui[i]] for i in ("after.run", "after.merge_weights", "after.merge_name", "after.merge_dtype")]
            if not args[1]:
                raise AfterError("adapter: the run has saved no adapter yet")
            for updates in view.merge(args[0], args[1], (args[2] or "").strip(), args[3]):
                if "after.serve" in updates:
                    text = updates.pop("after.serve")
                    updates["after.serve"] = gr.update(value=text, visible=bool(text))
                yield {ui[k]: v for k, v in updates.items()}

        merge_in = {ui[i] for i in ("after.run", "after.merge_weights", "after.merge_name", "after.merge_dtype")}
        gr.on([ui["after.merge"].click], on_merge, inputs=merge_in, outputs=[ui["after.merge_status"], ui["after.serve"]],
              show_progress="minimal", show_progress_on=[ui["after.merge"]])  # fmt: skip

        def on_push(got: Got) -> Updates:
            try:
                done = view.push(got[run], (got[ui["after.merge_name"]] or "").strip(), got[ui["after.repo_id"]] or "",
                                 got[ui["after.token"]] or "")  # fmt: skip
            except AfterError as exc:
                return {ui["after.merge_status"]: f"✗ {as_text(exc)}"}  # a Hub error quotes the repo id
            return {ui[k]: v for k, v in done.items()}

        listen([ui["after.push"].click], on_push, [run, *(ui[i] for i in ("after.merge_name", "after.repo_id",
               "after.token"))], [ui["after.merge_status"]], show_progress="minimal")  # fmt: skip

        def on_unload(request: gr.Request) -> None:  # this browser tab closed: its models go, unless shared
            view.release_session(request.session_hash, shared_too=False)

        page.blocks.unload(on_unload)
