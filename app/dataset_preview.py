"""The dataset preview beside the form: the first rows as the model sees them, their lengths, and the rows that
max_seq_length cuts; measured again by itself whenever what it depends on changes.

Reading the data and tokenizing need datasets and transformers, which the panel never imports
(tests/panel/test_imports.py): a measurement is `python -m tunedeck preview JOB --json --lengths` in a subprocess
(backend/data/preview.py), 6-8 s on a 2-core machine, nearly all of it imports. Its rows and each row's token length
stay in MEASUREMENTS, shared by every browser of this panel, under what they depend on (truncation.measure_key:
the data, its format and columns, the tokenizer); of local data with a local tokenizer, on disk too, so that a
restarted panel shows them at once. Every job event reads the measurement again for the job as set
(preview.for_job: milliseconds for 5,000 rows), so a change of max_seq_length, packing or the batch redraws the
numbers, the truncation warning (backend/data/truncation.py) and the memory estimate (which uses the longest measured
row) without measuring again, and any other field costs nothing. When the data or the tokenizer change, the job
event asks for a measurement (`wanted`); it runs outside the job queue, so edits go on meanwhile, and when it
lands (`measured`) the job is evaluated again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path

import gradio as gr

from tunedeck.app.job_events import JOB_QUEUE, DerivedView
from tunedeck.app.job_outputs import JobResult
from tunedeck.app.registry import Got, Registry, Updates, handler, listen
from tunedeck.app.untrusted_text import as_text, code_span
from tunedeck.backend.data import for_job, measure_key, measured_locally, why_not_measured
from tunedeck.backend.spec import JobSpec, SpecError, demo_home, spec_from_values, spec_to_yaml, values_from_form

PREVIEW_TIMEOUT_S = 300  # importing datasets and transformers on a busy 2-core machine takes a while
ROWS_SHOWN = 3
KEPT = 16  # measurements kept (about 100 KB each for 5,000 rows): the last datasets and models tried
KEPT_ON_DISK = 64  # of local data, in $TUNEDECK_HOME/preview/: the newest
# What measures: the preview's code. A measurement kept on disk by other code is not read (a changed row format).
MEASURER = hashlib.sha256(
    b"".join(
        (Path(__file__).parents[1] / part).read_bytes()
        for part in ("backend/data/preview.py", "backend/recipe/formats.py")
    )
).hexdigest()
# One measurement at a time in the whole panel, whoever asks: each is a process of 6-8 s of CPU.
MEASURE_QUEUE = {"concurrency_id": "dataset-preview", "concurrency_limit": 1}
FIX_FIRST = "✗ Fix the errors in the form first: the preview reads the job as set."
MEASURING = "Measuring the first rows with the model's tokenizer…"


class Measurements(Mapping):
    """The preview's measurements by measure_key, the last KEPT used; `version` counts those stored.

    With a folder, a measurement of local data with a local tokenizer (measured_locally: its key changes whenever
    they do) is also kept there, so a restarted panel shows it at once instead of measuring again for seconds.
    """

    def __init__(self, kept: int = KEPT, folder: Path | None = None):
        self._kept = kept
        self._folder = folder
        self._items: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()  # Gradio runs handlers in threads
        self.version = 0

    def __getitem__(self, key: str) -> dict:
        with self._lock:
            if key not in self._items and (kept := self._read(key)) is not None:
                self._items[key] = kept
            self._items.move_to_end(key)
            return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, measured: dict, keep: bool = False) -> int:
        """Store a measurement (`keep`: on disk too, when it is no error); the new version."""
        with self._lock:
            self._items[key] = measured
            self._items.move_to_end(key)
            while len(self._items) > self._kept:
                self._items.popitem(last=False)
            if keep and "error" not in measured:
                self._write(key, measured)
            self.version += 1
            return self.version

    def _file(self, key: str) -> Path | None:
        if self._folder is None:
            return None
        return self._folder / (hashlib.sha256(f"{MEASURER}\n{key}".encode()).hexdigest()[:32] + ".json")

    def _read(self, key: str) -> dict | None:
        path = self._file(key)
        try:
            return json.loads(path.read_text(encoding="utf-8")) if path is not None else None
        except (OSError, ValueError):  # none kept, or a file cut short: measure again
            return None

    def _write(self, key: str, measured: dict) -> None:
        path = self._file(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            staged = path.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(json.dumps(measured), encoding="utf-8")
            staged.replace(path)  # whole or not at all: another panel may read it now
            for old in sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEPT_ON_DISK]:
                old.unlink(missing_ok=True)
        except OSError:  # a read-only home: the measurement stays in memory only
            pass


MEASUREMENTS = Measurements(folder=demo_home().parent / "preview")


def run_preview(spec: JobSpec, rows: int = ROWS_SHOWN) -> dict:
    """`tunedeck preview --json --lengths` of the job in a subprocess: its JSON, or {"error": {field, message}}."""
    with tempfile.TemporaryDirectory(prefix="tunedeck-preview-") as folder:
        job = Path(folder) / "job.yaml"
        job.write_text(spec_to_yaml(spec), encoding="utf-8")
        argv = [sys.executable, "-m", "tunedeck", "preview", str(job), "--json", "--lengths", "--rows", str(rows)]
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


def preview_text(spec: JobSpec | None, measurements: Mapping[str, dict] = MEASUREMENTS) -> tuple[str, str | None]:
    """(the preview's markdown for the job as set, the measure_key to measure, or None when there is nothing to
    measure: measured already, or it would only fail)."""
    if spec is None:
        return FIX_FIRST, None
    key = measure_key(spec)
    found = measurements.get(key)
    if found is not None:
        return preview_markdown(found if "error" in found else for_job(found, spec)), None
    why = why_not_measured(spec)
    if why:
        return as_text(why), None
    return MEASURING, key


def preview_markdown(result: dict) -> str:
    """The rows in code blocks and one table of lengths; an error names its field."""
    if "error" in result:
        err = result["error"]
        return f"✗ {code_span(err['field'])}: {as_text(err['message'])}"
    s = result["stats"]
    if not s.get("rows"):
        return "The split has no rows."
    unit = "tokens" if result["counted"] == "tokens" else "tokens (estimated)"
    if s.get("limit_field"):  # GRPO: prompts alone, which the model answers itself
        return _prompts_markdown(result, s, unit)
    mixed = ", ".join(code_span(entry) for entry in result.get("mixed") or [])
    lines = [
        f"**{s['rows']:,} of {result['rows_in_split']:,} rows measured** ({unit}, counted with "
        f"{as_text(result['tokenizer'])}" + (f"; mixed in too, not measured here: {mixed}" if mixed else "") + "):",
        "",
        # One measure per line: the column beside the form is too narrow for seven columns.
        "| length | |",
        "|---|---|",
        f"| p50 · p95 · max | {s['p50']} · {s['p95']} · {s['max']} tokens |",
        f"| max_seq_length | {s['max_seq_length']} ({s['truncated']:,} rows truncated{_answers_cut(s)}) |",
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
            lines[-1] += f" ⚠ {as_text(labels['advice'])}."
    for i, text in enumerate(result["rows"], start=1):
        fence = "~~~~" if "```" in text else "```"
        lines += ["", f"Row {i} as the model sees it:", fence, text.replace(fence, ""), fence]
    return "\n".join(lines)


def _answers_cut(s: dict) -> str:
    """Of the rows truncated, those that lose their answer whole or in part (rows with an answer only)."""
    lost, cut = s.get("answer_lost", 0), s.get("answer_cut", 0)
    return f": the answer cut away whole in {lost:,}, cut short in {cut:,}" if lost + cut else ""


def _prompts_markdown(result: dict, s: dict, unit: str) -> str:
    """GRPO's prompts: their lengths against grpo.max_prompt_length (longer ones are left out of training) and
    what the model writes after each; no padding or packing (the answers are the model's)."""
    lines = [
        f"**{s['rows']:,} of {result['rows_in_split']:,} prompts measured** ({unit}, counted with "
        f"{as_text(result['tokenizer'])}):",
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
    """A derived view of the job: its text follows every job event; its measurement, the data and tokenizer."""

    def __init__(self, ui: Registry):
        self.ui = ui

    def build(self) -> None:
        add = self.ui.add
        self.section = add(
            "preview.section", gr.Accordion("Dataset preview", open=False, elem_id="dataset-preview-section")
        )
        with self.section:
            self.text = add(
                "preview.text",
                gr.Markdown(
                    "The first rows as the model will see them (after the format and chat template) and their "
                    "token lengths against max_seq_length.",
                    elem_id="dataset-preview",
                ),
            )
            self.button = add(
                "preview.run", gr.Button("Measure again", elem_id="preview-dataset", size="sm", min_width=120)
            )
        self.shown = add("preview.shown", gr.State(None))  # the markdown the browser shows
        self.wanted = add("preview.wanted", gr.State(None))  # the measure_key this browser asks to measure
        self.measured = add("preview.measured", gr.State(0))  # MEASUREMENTS.version when its last one landed
        self.inputs = []

    @property
    def outputs(self) -> list:
        return [self.text, self.shown, self.wanted]

    def context(self, got: Got) -> dict:
        return {"measured": MEASUREMENTS}

    def update(self, result: JobResult, got: Got) -> Updates:
        text, wanted = preview_text(result.spec)
        out: Updates = {self.wanted: wanted}  # a State: its change event fires only when the key differs
        if text != got[self.shown]:
            out[self.text] = out[self.shown] = text
        return out

    def measure(self, spec: JobSpec, again: bool = False) -> int:
        """Measure the job's data unless it is measured already (`again`: measure anyway); MEASUREMENTS.version."""
        key = measure_key(spec)
        if again or key not in MEASUREMENTS:
            MEASUREMENTS.put(key, run_preview(spec), keep=measured_locally(spec))
        return MEASUREMENTS.version

    def wire(self, view, uploaded, notice) -> None:
        """A job event that wants a measurement (`wanted` changes) or Measure again measures the job the form
        holds, outside the job queue; once it lands, the job is evaluated again (in the queue, as every edit).
        Data just uploaded opens the preview (`uploaded`: that fill's dependency)."""

        def measure(got: Got, again: bool = False) -> Updates:
            if not again and got[self.wanted] is None:
                return {}
            try:
                spec = spec_from_values(values_from_form(view.form.raw(got)))
            except SpecError:  # the job events show FIX_FIRST already
                return {}
            if not again and why_not_measured(spec):
                return {}
            return {self.measured: self.measure(spec, again)}

        inputs, outputs = [*view.form.components, self.wanted], [self.measured]
        listen(
            [self.wanted.change],
            measure,
            inputs=inputs,
            outputs=outputs,
            trigger_mode="always_last",
            show_progress="hidden",
            **MEASURE_QUEUE,
        )
        listen(
            [self.button.click],
            lambda got: measure(got, again=True),
            inputs=inputs,
            outputs=outputs,
            show_progress="minimal",
            show_progress_on=[self.text],
            **MEASURE_QUEUE,
        )

        def open_after_upload(got: Got) -> Updates:
            return {} if str(got[notice] or "").startswith("✗") else {self.section: gr.update(open=True)}

        uploaded.then(handler(open_after_upload), inputs={notice}, outputs=[self.section], show_progress="hidden")
        # Quiet, as every other edit: a full tracker would cover the whole form for a moment.
        listen(
            [self.measured.change],
            view.on_edit,
            inputs=view.inputs,
            outputs=view.outputs,
            show_progress="hidden",
            **JOB_QUEUE,
        )
