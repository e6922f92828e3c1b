"""The dataset preview beside the form: the first rows as the model sees them and their lengths.

Reading the data and tokenizing need datasets and transformers, which the panel never imports
(tests/panel/test_imports.py): the preview runs `python -m tunedeck preview JOB --json` in a
subprocess (backend/preview.py) on demand. Its statistics stay in the browser's state, and the
memory estimate uses the longest measured row (instead of dataset.max_seq_length) for as long
as the dataset, the model and the batch are the ones measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from html import escape
from pathlib import Path

import gradio as gr

from tunedeck.app.job_events import DerivedView
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates
from tunedeck.backend.preview import preview_key
from tunedeck.backend.spec import JobSpec, spec_to_yaml

PREVIEW_TIMEOUT_S = 300  # importing datasets and transformers on a busy 2-core machine takes a while
ROWS_SHOWN = 3


def run_preview(spec: JobSpec, rows: int = ROWS_SHOWN) -> dict:
    """`tunedeck preview --json` of the job in a subprocess: its JSON, or {"error": {field, message}}."""
    with tempfile.TemporaryDirectory(prefix="tunedeck-preview-") as folder:
        job = Path(folder) / "job.yaml"
        job.write_text(spec_to_yaml(spec), encoding="utf-8")
        argv = [sys.executable, "-m", "tunedeck", "preview", str(job), "--json", "--rows", str(rows)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=PREVIEW_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return {"error": {"field": "dataset.path", "message": f"the preview took over {PREVIEW_TIMEOUT_S} s"}}
    try:
        return json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": {"field": "dataset.path", "message": f"the preview failed: {last[:300]}"}}


def preview_markdown(result: dict) -> str:
    """The rows in code blocks and one table of lengths; an error names its field."""
    if "error" in result:
        err = result["error"]
        return f"✗ `{escape(err['field'])}`: {escape(err['message'])}"
    s = result["stats"]
    if not s.get("rows"):
        return "The split has no rows."
    unit = "tokens" if result["counted"] == "tokens" else "tokens (estimated)"
    if s.get("limit_field"):  # GRPO: prompts alone, which the model answers itself
        return _prompts_markdown(result, s, unit)
    mixed = ", ".join(f"`{escape(entry)}`" for entry in result.get("mixed") or [])
    lines = [
        f"**{s['rows']:,} of {result['rows_in_split']:,} rows measured** ({unit}, counted with "
        f"{escape(result['tokenizer'])}" + (f"; mixed in too, not measured here: {mixed}" if mixed else "") + "):",
        "",
        # One measure per line: the column beside the form is too narrow for seven columns.
        "| length | |",
        "|---|---|",
        f"| p50 · p95 · max | {s['p50']} · {s['p95']} · {s['max']} tokens |",
        f"| max_seq_length | {s['max_seq_length']} ({s['truncated']:,} rows truncated) |",
        f"| padding without packing | {s['padding_waste']:.0%} of the tokens in a batch |",
        f"| padding with packing | {s['padding_waste_packed']:.0%} |",
        "",
        f"Packing is **{'on' if result['packing'] else 'off'}**. "
        + (
            "The memory estimate now uses the longest row "
            f"({min(s['max'], s['max_seq_length'])} tokens) instead of max_seq_length."
            if not result["packing"]
            else "With packing every block is max_seq_length long, as the estimate assumes."
        ),
    ]
    labels = result.get("labels")
    if labels:  # KTO's answers: how many of each, and whether its weights balance them
        lines += ["", f"**Labels:** {labels['good']:,} good · {labels['bad']:,} bad."]
        if labels["advice"]:
            lines[-1] += f" ⚠ {escape(labels['advice'])}."
    for i, text in enumerate(result["rows"], start=1):
        fence = "~~~~" if "```" in text else "```"
        lines += ["", f"Row {i} as the model sees it:", fence, text.replace(fence, ""), fence]
    return "\n".join(lines)


def _prompts_markdown(result: dict, s: dict, unit: str) -> str:
    """GRPO's prompts: their lengths against grpo.max_prompt_length (longer ones are left out of training) and
    what the model writes after each; no padding or packing (the answers are the model's)."""
    lines = [
        f"**{s['rows']:,} of {result['rows_in_split']:,} prompts measured** ({unit}, counted with "
        f"{escape(result['tokenizer'])}):",
        "",
        "| length | |",
        "|---|---|",
        f"| p50 · p95 · max | {s['p50']} · {s['p95']} · {s['max']} tokens |",
        f"| grpo.max_prompt_length | {s['max_seq_length']} ({s['truncated']:,} prompts longer: left out) |",
        "",
        f"The model writes **{s['num_generations']} answers** to each prompt, up to "
        f"{s['max_completion_length']} tokens each (grpo.max_completion_length), and the rewards score them.",
    ]
    for i, text in enumerate(result["rows"], start=1):
        fence = "~~~~" if "```" in text else "```"
        lines += ["", f"Prompt {i}:", fence, text.replace(fence, ""), fence]
    return "\n".join(lines)


class DatasetPreview(DerivedView):
    def __init__(self, ui: Registry):
        self.ui = ui

    def build(self) -> None:
        add = self.ui.add
        self.section = add(
            "preview.section", gr.Accordion("Dataset preview", open=False, elem_id="dataset-preview-section")
        )
        with self.section:
            self.button = add("preview.run", gr.Button("Preview the dataset", elem_id="preview-dataset", size="sm"))
            self.text = add(
                "preview.text",
                gr.Markdown(
                    "The first rows as the model will see them (after the format and chat template) and their "
                    "token lengths against max_seq_length.",
                    elem_id="dataset-preview",
                ),
            )
        # {"key": preview_key, "stats": ..., "packing": ...} of the last preview: what the estimate reads.
        self.shown = add("preview.shown", gr.State(None))
        self.inputs = []

    @property
    def outputs(self) -> list:
        return []

    def context(self, got: Got) -> dict:
        return {"measured": got[self.shown]}

    def update(self, result: JobResult, got: Got) -> Updates:
        return {}

    def measure(self, spec: JobSpec) -> tuple[str, dict | None]:
        """(markdown, the state the estimate reads) for the job the form holds."""
        result = run_preview(spec)
        state = None if "error" in result else {"key": preview_key(spec), "stats": result["stats"]}
        return preview_markdown(result), state
