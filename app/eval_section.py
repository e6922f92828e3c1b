"""The Evaluate part of the Try · Evaluate · Export tab: its layout and events over AfterView.evaluate.

What stops an evaluation is said in its own status line, in the page's words and with the fix
(a run without held-out rows: pick or upload an evaluation file, or evaluate on rows of its
training file), not in a toast; an evaluation file that is the training file is a warning there
as soon as it is picked (backend/after/eval_data.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from tunedeck.app.after_events import shown, streamed, uploaded
from tunedeck.app.after_view import USER_ERRORS, AfterView
from tunedeck.app.eval_display import ANSWER_CHARS, EVAL_HEADERS, answers_widths, eval_checks, refused
from tunedeck.app.registry import Got, Updates, listen
from tunedeck.backend.after import DEFAULT_LIMIT, SHOW

ANSWERS_OUT = ("after.answers", "after.answers_note", "after.answers_file")
TRAINING_ROWS = 50  # rows of the training file the page offers to evaluate on


def build_evaluate(add) -> None:
    gr.Markdown("### Evaluate", elem_id="after-eval-title")
    with gr.Row():
        add(
            "after.eval_scope",
            gr.Radio(
                [("final adapter and base", "final"), ("base and every checkpoint", "all")],
                value="final",
                label="Models",
                elem_id="after-eval-scope",
            ),
        )
        add(
            "after.eval_data",
            gr.File(
                label="Evaluation data, or prompts alone to answer (default: the run's eval split)",
                type="filepath",
                file_types=[".jsonl", ".json", ".csv", ".parquet"],
                height=130,
                scale=2,
                elem_id="after-eval-data",
            ),
        )
        with gr.Column(min_width=160):
            add(
                "after.eval_limit",
                gr.Number(0, label="examples (0: all)", precision=0, minimum=0, elem_id="after-eval-limit"),
            )
            add("after.evaluate", gr.Button("Evaluate", variant="primary", elem_id="after-evaluate"))
        with gr.Column(min_width=160):
            add(
                "after.training_rows",
                gr.Number(
                    TRAINING_ROWS,
                    label="rows of the training file (seen in training)",
                    precision=0,
                    minimum=1,
                    elem_id="after-training-rows",
                ),
            )
            add("after.evaluate_training", gr.Button("Evaluate on training rows", elem_id="after-evaluate-training"))
    with gr.Row(equal_height=True):
        add(
            "after.eval_tasks",
            gr.Textbox(
                label="Benchmarks: lm-evaluation-harness tasks, comma-separated (demo_arith runs offline)",
                placeholder="demo_arith",
                scale=3,
                elem_id="after-eval-tasks",
            ),
        )
        add(
            "after.eval_tasks_limit",
            gr.Number(
                DEFAULT_LIMIT, label="questions per task (0: all)", precision=0, minimum=0, elem_id="after-tasks-limit"
            ),
        )
        add(
            "after.eval_forgetting",
            gr.Checkbox(
                label="Forgetting check: loss on general text, base vs adapter",
                elem_id="after-eval-forgetting",
            ),
        )
        add(
            "after.eval_general_text",
            gr.File(
                label="General text (.txt; default: the built-in sample)",
                type="filepath",
                file_types=[".txt", ".md"],
                height=100,
                elem_id="after-eval-general-text",
            ),
        )
    add("after.eval_status", gr.Markdown(elem_id="after-eval-status"))
    with gr.Row():
        add("after.eval_table", gr.Dataframe(headers=EVAL_HEADERS, interactive=False, elem_id="after-eval-table"))
        add("after.eval_chart", gr.Plot(label="loss and exact match", show_label=False, elem_id="after-eval-chart"))
    with gr.Row(equal_height=True):
        add(
            "after.answers_show",
            gr.Radio(
                [(label, key) for key, label in SHOW.items()],
                value="all",
                label="Each answer of the last evaluation",
                scale=4,
                elem_id="after-answers-show",
            ),
        )
        add(
            "after.answers_file",
            gr.DownloadButton("⬇ Answers (.jsonl)", interactive=False, scale=1, elem_id="after-answers-file"),
        )
    add("after.answers_note", gr.Markdown(elem_id="after-answers-note"))
    # A long answer is cut in its cell (the download has it whole); shown() gives each column its width.
    add(
        "after.answers",
        gr.Dataframe(
            headers=["#", "prompt", "the data's answer"],
            interactive=False,
            wrap=True,
            max_height=420,
            max_chars=ANSWER_CHARS,
            column_widths=answers_widths(3),
            elem_id="after-answers",
        ),
    )


def wire_evaluate(ui, view: AfterView) -> None:
    run, status = ui["after.run"], ui["after.eval_status"]

    def evaluating(got: Got, **source) -> Iterator[Updates]:
        limit = got[ui["after.eval_limit"]]
        try:
            checks = eval_checks(
                got[ui["after.eval_tasks"]],
                got[ui["after.eval_tasks_limit"]],
                got[ui["after.eval_forgetting"]],
                uploaded(got[ui["after.eval_general_text"]]),
            )
        except USER_ERRORS as exc:
            yield {status: refused(exc)}
            return
        for updates in view.evaluate(
            got[run],
            got[ui["after.eval_scope"]],
            limit=int(limit) if limit else None,
            show=got[ui["after.answers_show"]],
            checks=checks,
            **source,
        ):
            yield shown(ui, updates)

    @streamed
    def on_evaluate(got: Got) -> Iterator[Updates]:
        try:
            data = uploaded(got[ui["after.eval_data"]])
        except USER_ERRORS as exc:
            yield {status: refused(exc)}
            return
        yield from evaluating(got, data_file=data)

    @streamed
    def on_evaluate_training(got: Got) -> Iterator[Updates]:
        yield from evaluating(got, training_rows=int(got[ui["after.training_rows"]] or TRAINING_ROWS))

    eval_out = [ui[i] for i in ("after.eval_status", "after.eval_table", "after.eval_chart", *ANSWERS_OUT)]
    ids = ("after.eval_scope", "after.eval_data", "after.eval_limit", "after.answers_show", "after.training_rows")
    ids += ("after.eval_tasks", "after.eval_tasks_limit", "after.eval_forgetting", "after.eval_general_text")
    eval_in = {run, *(ui[i] for i in ids)}
    for button, handler in (("after.evaluate", on_evaluate), ("after.evaluate_training", on_evaluate_training)):
        gr.on(
            [ui[button].click],
            handler,
            inputs=eval_in,
            outputs=eval_out,
            show_progress="minimal",
            show_progress_on=[ui[button]],
            concurrency_id="after-evaluate",
        )

    def on_eval_data(got: Got) -> Updates:  # a file just picked: is it the training file?
        try:
            return shown(ui, view.eval_data_note(got[run], uploaded(got[ui["after.eval_data"]])))
        except USER_ERRORS as exc:
            return {status: refused(exc)}

    listen([ui["after.eval_data"].upload], on_eval_data, [run, ui["after.eval_data"]], [status], show_progress="hidden")

    def on_answers_show(got: Got) -> Updates:  # another filter of the same answers
        return shown(ui, view.answers_view(got[run], got[ui["after.answers_show"]])) if got[run] else {}

    listen(
        [ui["after.answers_show"].input],
        on_answers_show,
        [run, ui["after.answers_show"]],
        [ui["after.answers"], ui["after.answers_note"], ui["after.answers_file"]],
        show_progress="hidden",
    )
