"""The Try part of the Try · Evaluate · Export tab: its layout and events over AfterView.answer.

A prompt goes to the chosen weights and, beside them, to a second model; an example from the run's
data (or a row of the evaluation's answers) fills the prompt and shows the data's answer, which the
answer is judged against while the prompt is unchanged. A run trained on conversations keeps the
conversation (each answer sees the earlier turns) and takes a system message.
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from tunedeck.app.after_events import streamed
from tunedeck.app.after_view import USER_ERRORS, AfterView
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.after import MAX_NEW_TOKENS, transcript

EXAMPLE_OUT = ("after.example_prompt", "after.expected", "after.example_note")
CHAT_ONLY = ("after.system", "after.converse", "after.new_chat")  # shown for runs trained on conversations
TO_TRY_BOX_JS = "() => document.getElementById('after-prompt')?.scrollIntoView({block: 'center'})"
SETTINGS = ("max_new_tokens", "temperature", "top_p", "repetition_penalty", "stop")


def build_try(add) -> None:
    gr.Markdown("### Try", elem_id="after-try-title")
    add(
        "after.system",
        gr.Textbox(
            label="System message (sent first, through the chat template)",
            lines=1,
            visible=False,
            placeholder="none: the model's own default, if its template has one",
            elem_id="after-system",
        ),
    )
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
        add(
            "after.converse",
            gr.Checkbox(
                True,
                label="Keep the conversation",
                visible=False,
                scale=4,
                info="a chat run: each answer sees the earlier turns, shown above it",
                elem_id="after-converse",
            ),
        )
        add("after.new_chat", gr.Button("New conversation", visible=False, scale=1, elem_id="after-new-chat"))
    add("after.example_note", gr.Markdown(elem_id="after-example-note"))
    add("after.example_prompt", gr.State(None))  # the example's prompt: its answer is judged while it is unchanged
    add("after.history", gr.State(None))  # {"with": (run, weights, beside), "turns": {answer box id: turns}}
    with gr.Accordion("Generation settings", open=False, elem_id="after-settings"):
        with gr.Row():
            add(
                "after.max_new_tokens",
                gr.Number(
                    64,
                    label="max new tokens",
                    precision=0,
                    minimum=1,
                    maximum=MAX_NEW_TOKENS,
                    elem_id="after-max-new-tokens",
                ),
            )
            add("after.temperature", gr.Slider(0, 2, 0, step=0.05, label="temperature (0 = greedy)"))
            add("after.top_p", gr.Slider(0.05, 1, 1, step=0.05, label="top-p"))
            add("after.repetition_penalty", gr.Number(1.0, label="repetition penalty (1 = off)"))
            add("after.stop", gr.Textbox(label="stop strings (one per line)", lines=2, elem_id="after-stop"))
    with gr.Row():
        add("after.answer", gr.Textbox(label="Answer", lines=6, interactive=False, elem_id="after-answer"))
        add(
            "after.compare_answer",
            gr.Textbox(label="Beside it", lines=6, interactive=False, elem_id="after-compare-answer"),
        )
        add(
            "after.expected",
            gr.Textbox(label="The data's answer", lines=6, interactive=False, visible=False, elem_id="after-expected"),
        )
    add("after.status", gr.Markdown(elem_id="after-status"))


def no_example(ui) -> Updates:
    """The example and the data's answer go: the prompt is no longer the example's, or the run changed."""
    return {
        ui["after.example_prompt"]: None,
        ui["after.expected"]: gr.update(value="", visible=False),
        ui["after.example_note"]: "",
    }


def wire_try(ui, view: AfterView) -> None:
    run = ui["after.run"]
    answer_in = [
        "after.run",
        "after.weights",
        "after.compare",
        "after.prompt",
        *("after." + s for s in SETTINGS),
        "after.example_prompt",
        "after.expected",
        "after.converse",
        "after.history",
        "after.system",
    ]

    @streamed
    def on_answer(got: Got, request: gr.Request) -> Iterator[Updates]:
        value = {i: got[ui[i]] for i in answer_in}
        settings = {s: value["after." + s] for s in SETTINGS}
        settings["stop"] = [line for line in (settings["stop"] or "").splitlines() if line]
        prompt = value["after.prompt"] or ""
        example = value["after.example_prompt"]
        from_example = prompt == example  # an edited example has no known answer
        expected = value["after.expected"] if from_example and value["after.expected"] else None
        left = {} if from_example or example is None else no_example(ui)
        args = (value["after.run"], value["after.weights"], value["after.compare"] or "", prompt)
        # A conversation goes on while the same models answer; other models start a new one.
        history = value["after.history"] or {}
        chat = view.converses(args[0])
        conversing = bool(value["after.converse"]) and chat
        turns = history.get("turns", {}) if tuple(history.get("with", ())) == args[:3] else {}
        yield {ui["after.answer"]: "", ui["after.compare_answer"]: "", ui["after.status"]: "", **left}
        for updates in view.answer(
            *args,
            settings,
            session=request.session_hash or "",  # Gradio gives none outside a browser session
            expected=expected,
            history=turns if conversing else None,
            system=(value["after.system"] or "") if chat else "",
        ):
            if "after.history" in updates:  # answered: the prompt now shows in the conversation, the box is free
                updates.update(
                    {"after.history": {"with": args[:3], "turns": updates["after.history"]}, "after.prompt": ""}
                )
            yield {ui[k]: v for k, v in updates.items()}

    answer_out = ("after.answer", "after.compare_answer", "after.status", "after.prompt", "after.history")
    gr.on(
        [ui["after.ask"].click, ui["after.prompt"].submit],
        on_answer,
        inputs={ui[i] for i in answer_in},
        outputs=[ui[i] for i in (*answer_out, *EXAMPLE_OUT)],
        concurrency_limit=4,
        trigger_mode="once",  # a second click while answering is ignored: the models answer one prompt at a time
        show_progress="minimal",
        show_progress_on=[ui["after.ask"]],
    )

    example_in = [run, *(ui[i] for i in ("after.weights", "after.compare", "after.converse"))]

    def on_example(got: Got, number: int | None = None) -> Updates:
        try:
            conversing = bool(got[ui["after.converse"]])
            if number is None:
                found = view.example(got[run], conversing=conversing)
            else:
                found = view.evaluated_example(got[run], number, conversing)
        except USER_ERRORS as exc:  # no run, or data without a prompt and answer: said where the example goes
            return {**no_example(ui), ui["after.example_note"]: f"✗ {as_text(exc)}"}
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

    example_out = [
        ui[i]
        for i in (
            "after.prompt",
            *EXAMPLE_OUT,
            "after.system",
            "after.history",
            "after.answer",
            "after.compare_answer",
            "after.status",
        )
    ]
    listen(
        [ui["after.example"].click],
        on_example,
        example_in,
        example_out,
        show_progress="minimal",
        show_progress_on=[ui["after.example"]],
    )

    def on_answers_row(got: Got, picked: gr.SelectData) -> Updates:  # a row of the answers: into the Try box
        return on_example(got, int(picked.row_value[0])) if picked.row_value else {}

    listen([ui["after.answers"].select], on_answers_row, example_in, example_out, show_progress="hidden").then(
        None, js=TO_TRY_BOX_JS
    )

    def on_new_chat(got: Got) -> Updates:
        cleared = {ui[i]: "" for i in ("after.answer", "after.compare_answer", "after.status")}
        return {ui["after.history"]: None, **cleared}

    new_chat_out = [ui[i] for i in ("after.history", "after.answer", "after.compare_answer", "after.status")]
    listen([ui["after.new_chat"].click], on_new_chat, [], new_chat_out, show_progress="hidden")

    def on_release(got: Got, request: gr.Request) -> Updates:
        return {ui[k]: v for k, v in view.release_session(request.session_hash or "").items()}

    listen([ui["after.release"].click], on_release, [run], [ui["after.status"]])
