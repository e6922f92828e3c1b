"""What the dataset preview adds to one edit of the form, measured on the page's own handler (JobView.on_edit with
the preview among its derived views, as app/job_tab.py wires them), without a browser:

1. an edit of an unrelated field (training.learning_rate) with no measurement held: the preview only says what
   it waits for;
2. the same edit with the job's data measured (the preview reads its rows again for the job as set, and the
   truncation warning joins the problems);
3. an edit of dataset.max_seq_length with the data measured (new numbers and a new warning, no new measurement);
4. the measurement itself (`tunedeck preview --json --lengths` in a subprocess), which an edit of the data or the
   model asks for and which runs outside the job queue.

    .venv/bin/python bench/bench_preview.py [--repeats 20] [--data FILE.jsonl --format messages]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gradio as gr

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tunedeck.app.dataset_preview import MEASUREMENTS, DatasetPreview, run_preview  # noqa: E402
from tunedeck.app.downloads import BundleWriter  # noqa: E402
from tunedeck.app.form import build_form  # noqa: E402
from tunedeck.app.job_events import JobShown  # noqa: E402
from tunedeck.app.job_view import JobView  # noqa: E402
from tunedeck.app.registry import Registry  # noqa: E402
from tunedeck.backend.data.demo import ensure_demo  # noqa: E402
from tunedeck.backend.data.truncation import measure_key  # noqa: E402
from tunedeck.backend.render import render_bundle  # noqa: E402
from tunedeck.backend.spec import resolve_spec, set_paths  # noqa: E402
from tunedeck.backend.spec.fields import FORM_FIELDS, values_from_spec  # noqa: E402


def page(spec, folder: Path) -> tuple[JobView, DatasetPreview]:
    with gr.Blocks():
        ui = Registry()
        values = values_from_spec(spec)
        form = build_form({f.path: f.to_form(values[f.path]) for f in FORM_FIELDS}, ui)
        preview = DatasetPreview(ui)
        preview.build()
        view = JobView(ui, form, list(render_bundle(spec)), BundleWriter(folder))
        view.build_status()
        view.build_files()
        view.derived.append(preview)
    return view, preview


def edit_ms(view: JobView, preview: DatasetPreview, before, after, repeats: int) -> float:
    """The median milliseconds of on_edit from a browser showing `before` whose form now holds `after`."""
    raw = lambda spec: [f.to_form(values_from_spec(spec)[f.path]) for f in FORM_FIELDS]  # noqa: E731
    base = {view.shown: JobShown(), view.fills: 0, preview.shown: None}
    shown = view.on_edit({**dict(zip(view.form.components, raw(before))), **base})
    got = {**dict(zip(view.form.components, raw(after))), **base, view.shown: shown[view.shown]}
    got[preview.shown] = shown.get(preview.shown)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        view.on_edit(dict(got))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--data", help="a data file to measure instead of the demo's 2,000 rows")
    parser.add_argument("--format", default="prompt-completion")
    args = parser.parse_args()
    ensure_demo()
    sets = [f"dataset.path={args.data}", f"dataset.format={args.format}"] if args.data else []
    spec = resolve_spec("demo", sets)
    other = set_paths(spec, {"training.learning_rate": 1e-3})
    shorter = set_paths(spec, {"dataset.max_seq_length": 16})
    with tempfile.TemporaryDirectory() as folder:
        view, preview = page(spec, Path(folder))
        print(f"1. an unrelated edit, nothing measured: {edit_ms(view, preview, spec, other, args.repeats):.1f} ms")
        started = time.perf_counter()
        measured = run_preview(spec)
        took = time.perf_counter() - started
        MEASUREMENTS.put(measure_key(spec), measured)
        rows = len(measured.get("lengths") or [])
        print(f"2. the same edit, {rows:,} rows measured: {edit_ms(view, preview, spec, other, args.repeats):.1f} ms")
        print(f"3. max_seq_length 64 -> 16, read again: {edit_ms(view, preview, spec, shorter, args.repeats):.1f} ms")
        print(f"4. one measurement (a subprocess, outside the job queue): {took:.1f} s")


if __name__ == "__main__":
    main()
