"""What the page shows beside the form, computed in one pass from the form's values.

Parse -> validate -> render -> advise, once per change: the files, the problems, the global
batch and the memory advice all come from the same JobSpec, so they can never disagree,
and the strategies are compared once per keystroke (the one `Advice` that the estimate's
text, table, chart and Apply read). Pure Python (no Gradio), so it is tested directly.

The problems include everything Start would refuse on (backend/runs/preflight.py, for `here`, this
machine): a local model folder or data file that does not exist, no GPU for a GPU job, ... so
"No problems" is never shown beside a job that Start refuses. They cost stat calls, not reads:
a data file's first rows are read once per version of the file (backend/runs/preflight_inputs.py).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tunedeck.app.estimate_view import Unavailable, compute_advice
from tunedeck.app.form_marks import problem_link
from tunedeck.app.untrusted_text import as_text
from tunedeck.backend.data import held_out_offer, measured_facts, measured_lengths
from tunedeck.backend.estimate import Advice, Hardware, fit_problems
from tunedeck.backend.recipe import STRATEGIES
from tunedeck.backend.runs import Calibration, RunManager, RunStatus, needs_gpus_here
from tunedeck.backend.runs import preflight_problems as preflight
from tunedeck.backend.spec import (
    FIELDS_BY_PATH,
    JobSpec,
    SpecError,
    Values,
    refuses_start,
    shown,
    spec_from_values,
    spec_from_yaml,
)
from tunedeck.backend.validate import Problem, has_errors, validate

UPLOAD_LIMIT_BYTES = 256 * 1024
_PLAIN_FIELD = re.compile(r"[A-Za-z0-9_.]+")  # every spec field; an unknown key from a file may hold anything


RUNS_READ_EVERY_S = 2.0  # the live runs (for the GPUs they hold) are listed again at most this often


class ThisMachine:
    """This machine as the live checks see it: its runs folder, its GPUs (the panel's monitor), its live runs."""

    def __init__(self, runs_dir: Path, monitor: Any):
        self.runs_dir = Path(runs_dir).resolve()
        self.monitor = monitor  # backend/machine/monitor.py's Monitor: NVML's GPUs, found once
        self._runs: tuple[float, list[RunStatus]] = (-1e9, [])
        self._lock = threading.Lock()

    def gpus(self) -> list[int]:
        return list(range(self.monitor.gpu_count))

    def runs(self) -> list[RunStatus]:
        with self._lock:
            if time.monotonic() - self._runs[0] > RUNS_READ_EVERY_S:
                self._runs = (time.monotonic(), RunManager(self.runs_dir).list_runs())
            return self._runs[1]

    def problems(self, spec: JobSpec) -> list[Problem]:
        """What Start would refuse on beyond the job's rules, checked on this machine (backend/runs/preflight.py)."""
        gpus = self.gpus()
        runs = self.runs() if needs_gpus_here(spec) and gpus else None
        offer = held_out_offer(spec, self.runs_dir)  # an upload with nothing held out: its Fix holds rows out
        return preflight(spec, self.runs_dir, gpus, runs) + ([offer] if offer else [])


@dataclass
class JobResult:
    values: Values
    spec: JobSpec | None
    issues: list[Problem] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    advice: Advice | Unavailable | None = None  # None: no GPU size given, or the spec does not parse
    calibration: Calibration | None = None  # your finished runs on the estimate's GPU vs their predictions

    @property
    def has_errors(self) -> bool:
        return any(i.level == "error" for i in self.issues)

    @property
    def start_refusals(self) -> list[Problem]:
        """What Start on this machine refuses on: the errors, and the warnings about this machine (no GPU here):
        those leave the bundle downloadable."""
        return refuses_start(self.issues)

    @property
    def error_fields(self) -> set[str]:
        return {i.field for i in self.issues if i.level == "error" and i.field}


def evaluate(
    values: Values,
    gpu_text: str | None = None,
    ram_text: str | None = None,
    measured: dict | None = None,
    correction: float = 1.0,
    hardware: Hardware | None = None,
    calibration: Calibration | None = None,
    here: ThisMachine | None = None,
) -> JobResult:
    """Everything the page derives from the form's values; the memory advice for a GPU of `gpu_text`
    and host RAM of `ram_text` (empty: not checked), and whether the job fits them (backend/estimate/fit.py).
    `measured`: the dataset preview's measurements by what they depend on (app/dataset_preview.py), used while
    one is this job's data's;
    `correction`: the speed correction from your runs, 1 when not applied; `hardware`: the GPU speed is
    predicted on (app/estimate_panel.py; None: the one the GPU box names, else the assumed one); `calibration`:
    your runs against their predictions, carried to the estimate's text (the scan `correction` came from);
    `here`: this machine, whose checks (what Start refuses on) join the problems when the job's rules hold."""
    from tunedeck.backend.render import render_bundle

    try:
        spec = spec_from_values(values)
    except SpecError as exc:
        return JobResult(values, None, list(exc.problems))
    issues = validate(spec)
    if here is not None and not has_errors(issues):  # the same rule as `tunedeck validate` and Start
        try:
            found = here.problems(spec)
        except Exception as exc:  # noqa: BLE001 - a check that breaks must read as a message, not a blank page
            found = [Problem("warning", "", f"this machine's checks could not run: {type(exc).__name__}: {exc}")]
        issues = sorted(issues + found, key=lambda p: p.level != "error")
    try:
        files = render_bundle(spec)
    except Exception as exc:  # noqa: BLE001 - a generator bug must read as a message, not a blank page
        files = {}
        issues.append(Problem("error", "", f"the files could not be generated: {type(exc).__name__}: {exc}"))
    seq_len, cut = measured_facts(spec, measured)  # the preview's lengths, while they are this job's data
    issues += cut  # rows cut at max_seq_length (backend/data/truncation.py)
    lengths = measured_lengths(spec, measured)  # and how its rows fill a batch (backend/estimate/speed_data.py)
    advice = (
        None if gpu_text is None else compute_advice(spec, gpu_text, ram_text, hardware, seq_len, correction, lengths)
    )
    if isinstance(advice, Advice) and not has_errors(issues):  # the same rule as `tunedeck validate`
        issues = sorted(issues + fit_problems(spec, advice), key=lambda p: p.level != "error")
    return JobResult(values, spec, issues, files, advice, calibration)


def issues_markdown(result: JobResult) -> str:
    if not result.issues:
        return "✓ **No problems.** The files shown are exactly what Start runs."
    errors = [i for i in result.issues if i.level == "error"]
    warnings = [i for i in result.issues if i.level == "warning"]
    head = []
    if errors:
        head.append(
            f"✗ **{len(errors)} error{'s' * (len(errors) > 1)}**: Start and the bundle download are disabled until fixed."
        )
    if warnings:
        head.append(f"⚠ **{len(warnings)} warning{'s' * (len(warnings) > 1)}**")
    return "\n".join([" · ".join(head), *_problem_lines(errors + warnings)])


def _problem_lines(issues: list[Problem]) -> list[str]:
    """One markdown list item per problem, its field's label a link to the field; the field and message may
    hold text from the input: escaped."""
    lines = []
    for issue in issues:
        mark = "✗" if issue.level == "error" else "⚠"
        form_field = FIELDS_BY_PATH.get(issue.field)
        if form_field is not None:  # a link that jumps to the field (form_marks.JUMP_JS)
            where = f"[**{form_field.label}**]({problem_link(issue.field)}) (`{issue.field}`): "
        elif _PLAIN_FIELD.fullmatch(issue.field):
            where = f"`{issue.field}`: "
        else:
            where = f"{as_text(issue.field)}: " * bool(issue.field)
        lines.append(f"- {mark} {where}{as_text(issue.message)}")
    return lines


def batch_markdown(values: Values) -> str:
    """Global batch = per-device batch x processes x accumulation, stated with its factors."""
    per_device = _factor(values.get("training.per_device_train_batch_size"))
    processes = _factor(values.get("launch.num_processes"))
    accumulation = _factor(values.get("training.gradient_accumulation_steps"))
    if per_device is None or processes is None or accumulation is None:
        return "**Global batch:** (fix the batch fields to see it)"
    per_sequence = _gpus_per_sequence(values)
    readers = f"{processes} processes"
    if per_sequence > 1:  # the GPUs sharing each sequence (Ulysses) read their rows together
        groups = processes // per_sequence
        readers = f"{groups} sequence group{'s' * (groups != 1)} ({readers}, {per_sequence} GPUs per sequence)"
    total = per_device * (processes // per_sequence) * accumulation
    tokens = values.get("dataset.max_seq_length")
    token_note = (
        f" · up to {total * tokens:,} tokens per step" if isinstance(tokens, int) and 0 < tokens <= 2**20 else ""
    )
    return (
        f"**Global batch: {total}** sequences per optimizer step = {per_device} per device "
        f"× {readers} × {accumulation} accumulation steps{token_note}"
    )


def _factor(value: Any) -> int | None:
    """A batch factor the line can state: an int in 1..2**20, else None. The bound is above each factor's own (4096,
    65536, 4096): a value past it is an error anyway, and a product of 5,000-digit numbers cannot even be printed."""
    return value if isinstance(value, int) and 0 < value <= 2**20 else None


def _gpus_per_sequence(values: Values) -> int:
    """strategy.sequence_parallel where it applies and divides the processes (else validation says why), or 1."""
    per_sequence, processes = values.get("strategy.sequence_parallel"), values.get("launch.num_processes")
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    if (
        strategy
        and strategy.is_deepspeed
        and isinstance(per_sequence, int)
        and isinstance(processes, int)
        and 1 < per_sequence <= processes
    ):
        return per_sequence if processes % per_sequence == 0 else 1
    return 1


def read_uploaded_spec(path: str | None) -> tuple[str, JobSpec | None]:
    """(message, spec or None): an invalid upload says what is wrong and changes nothing."""
    if not path:
        return "No file received.", None
    file = Path(path)
    name = as_text(shown(file.name))
    try:
        if file.stat().st_size > UPLOAD_LIMIT_BYTES:
            return (
                f"✗ **{name}** is larger than {UPLOAD_LIMIT_BYTES // 1024} KB; a job spec is a short YAML file.",
                None,
            )
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return f"✗ **{name}** is not a text file; upload a job.yaml.", None
    except OSError as exc:
        return f"✗ **{name}** could not be read ({as_text(exc.strerror or exc)}); upload it again.", None
    try:
        spec = spec_from_yaml(text)
    except SpecError as exc:
        lines = _problem_lines([replace(p, field=p.field or "job") for p in exc.problems])
        return f"✗ **{name}** was not loaded; the form is unchanged:\n" + "\n".join(lines), None
    return f"Loaded **{name}**.", spec
