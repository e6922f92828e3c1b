"""The page's GGUF export over AfterView's run folders: in a worker, into <run>/gguf/<name>/ (as `tunedeck export-gguf`
writes); a bar of its steps while it works, then its files (size, type, template, stop tokens) and the Modelfile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tunedeck.app.after_view import NAME_PATTERN, AfterView
from tunedeck.app.untrusted_text import as_text, code_span
from tunedeck.app.worker_tasks import in_background
from tunedeck.backend.after import parse_quants, run_task
from tunedeck.backend.runs import AfterError

GGUF_DIR = "gguf"  # under the run folder, as `tunedeck export-gguf` writes


def export_gguf(view: AfterView, run_id: str, weights: str, name: str, quants: list[str]) -> Iterator[dict]:
    """Export in a worker; yield {"after.gguf_status": ...} per step, then the files and {"after.modelfile": ...}."""
    if not NAME_PATTERN.match(name or ""):
        raise AfterError("folder name: use letters, digits, '.', '_' and '-' (up to 64), e.g. model-q4")
    quants = parse_quants(quants or [])
    _, job = view.run_and_job(run_id)
    out_dir = view.manager.run_dir(run_id) / GGUF_DIR / name
    if out_dir.exists() and any(out_dir.iterdir()):
        raise AfterError(f"folder name: {out_dir} already holds an export; choose another name")
    checkpoint, _ = view.weights_choice(weights)
    args = {"run_id": run_id, "checkpoint": checkpoint, "out_dir": str(out_dir), "quants": quants}
    result = {}
    for event in in_background(
        lambda on_event: result.update(run_task("export_gguf", args, job, view.manager.runs_dir, on_event)), bar=True
    ):
        yield {"after.gguf_status": as_text(event)}
    yield {"after.gguf_status": files_markdown(result), "after.modelfile": _modelfile(result)}


def files_markdown(result: dict) -> str:
    """What was written: each file with its size, type, template and stop tokens; the `ollama create` command."""
    lines = [f"saved to {code_span(result['out_dir'])}:", ""]
    for quant, made in result["files"].items():
        meta = made["metadata"]
        stops = ", ".join(meta[k]["text"] for k in ("eos_token", "eot_token") if k in meta) or "none"
        template = "the run's chat template" if meta.get("chat_template") else "no chat template"
        lines.append(
            f"- {code_span(made['file'])} · {made['bytes'] / 2**20:.1f} MiB · {quant} · {template} · "
            f"stops at {code_span(stops)}"
        )
    modelfile = result["modelfile"]
    lines += ["", f"Ollama: {code_span(result['ollama_create'])} ({modelfile['prompt_format']} prompt format)"]
    if modelfile.get("note"):
        lines.append(f"\n⚠ {as_text(modelfile['note'])}")
    return "\n".join(lines)


def _modelfile(result: dict) -> str:
    return (Path(result["out_dir"]) / result["modelfile"]["file"]).read_text(encoding="utf-8")
