"""The page's exports over AfterView's run folders, each in a worker: a merge into <run>/merged/<name>/ (then its
serve.sh), a GGUF export into <run>/gguf/<name>/ (as `tunedeck export-gguf` writes: a bar of its steps, then its files
with size, type, template and stop tokens, and the Modelfile), each followed by the export check of what it wrote
(held-out answers compared with the adapter's); a push of a merged folder to the Hub.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tunedeck.app.after_view import NAME_PATTERN, AfterView
from tunedeck.app.untrusted_text import as_text, code_span
from tunedeck.app.worker_tasks import in_background
from tunedeck.backend.after import (
    EXPORT_CHECK_PROMPTS,
    create_model,
    default_host,
    parse_quants,
    run_export,
    server_models,
)
from tunedeck.backend.render import SERVE_FILE
from tunedeck.backend.runs import AfterError

MERGED_DIR = "merged"  # under the run folder: where the page writes merged models
GGUF_DIR = "gguf"  # under the run folder, as `tunedeck export-gguf` writes
DIFFERENCES_SHOWN = 3  # differing answers listed per check; `tunedeck check-export --json` gives them all


def merge_dir(view: AfterView, run_id: str, name: str) -> Path:
    if not NAME_PATTERN.match(name or ""):
        raise AfterError("merge name: use letters, digits, '.', '_' and '-' (up to 64), e.g. merged-bf16")
    return view.manager.run_dir(run_id) / MERGED_DIR / name


def merge(view: AfterView, run_id: str, weights: str, name: str, dtype: str, check: bool = True) -> Iterator[dict]:
    """Merge in a worker into <run>/merged/<name> (then check its answers when `check`); yield progress, then where it
    is, how to serve it and the check's line."""
    out_dir = merge_dir(view, run_id, name)
    _, job = view.run_and_job(run_id)
    checkpoint, base = view.weights_choice(weights)
    if base:
        raise AfterError("merge: pick an adapter (the final one or a checkpoint), not the base model")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise AfterError(f"merge name: {out_dir} already holds a merged model; choose another name")
    note = f" · QLoRA: merged into the base loaded in {dtype}, not into 4-bit weights" if job.method == "qlora" else ""
    args = {"run_id": run_id, "checkpoint": checkpoint, "out_dir": str(out_dir), "dtype": dtype}
    done = {}
    for event in in_background(lambda on_event: done.update(_export_task(view, "merge", args, job, check, on_event))):
        yield {"after.merge_status": as_text(event + note)}
    serve = Path(done["result"]["out_dir"]) / SERVE_FILE
    yield {
        "after.merge_status": f"saved to {as_text(done['result']['out_dir'] + note)}\n\n"
        f"serve it: {code_span(f'bash {serve}')} (or {code_span(f'bash {serve} adapter')})"
        + checks_markdown(done["reports"]),
        "after.serve": serve.read_text(encoding="utf-8") if serve.is_file() else "",
    }


def push(view: AfterView, run_id: str, name: str, repo_id: str, token: str) -> dict:
    from tunedeck.backend.after import push_folder

    folder = merge_dir(view, run_id, name)
    if not (folder / "config.json").is_file():
        raise AfterError(f"merge name: {folder} holds no merged model yet; Merge first, then push")
    try:
        url = push_folder(folder, repo_id.strip(), token.strip() or None)
    except AfterError as exc:  # its messages name the CLI's flag; the page's box is "Hub repo id"
        raise AfterError(str(exc).replace("--repo-id:", "Hub repo id:", 1)) from None
    return {"after.merge_status": f"pushed to {as_text(url)}"}


def _export_task(view: AfterView, op: str, args: dict, job, check: bool, on_event) -> dict:
    """The export in a worker, then its check there when `check`: {"result": ..., "reports": [...]}."""
    prompts = EXPORT_CHECK_PROMPTS if check else 0
    result, reports = run_export(op, args, job, view.manager.runs_dir, prompts, on_event)
    return {"result": result, "reports": reports}


def export_gguf(
    view: AfterView, run_id: str, weights: str, name: str, quants: list[str], check: bool = True
) -> Iterator[dict]:
    """Export in a worker (then check each file's answers when `check`); yield {"after.gguf_status": ...} per step,
    then the files, the check's lines and {"after.modelfile": ...}."""
    if not NAME_PATTERN.match(name or ""):
        raise AfterError("folder name: use letters, digits, '.', '_' and '-' (up to 64), e.g. model-q4")
    quants = parse_quants(quants or [])
    _, job = view.run_and_job(run_id)
    out_dir = _export_dir(view, run_id, name)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise AfterError(f"folder name: {out_dir} already holds an export; choose another name")
    checkpoint, _ = view.weights_choice(weights)
    args = {"run_id": run_id, "checkpoint": checkpoint, "out_dir": str(out_dir), "quants": quants}
    done = {}
    for event in in_background(
        lambda on_event: done.update(_export_task(view, "export_gguf", args, job, check, on_event)), bar=True
    ):
        yield {"after.gguf_status": as_text(event)}
    yield {
        "after.gguf_status": files_markdown(done["result"]) + checks_markdown(done["reports"]),
        "after.modelfile": _modelfile(done["result"]),
    }


def ollama_offer(view: AfterView, run_id: str, name: str, host: str) -> dict:
    """Whether an Ollama server answers at `host` for the export <run>/gguf/<name>/: {"after.ollama_status": ...,
    "ready": True when Create in Ollama can go}. Asked when an export ends and when the address changes."""
    host = host.strip() or default_host()
    if not run_id or not NAME_PATTERN.match(name or "") or not _export_dir(view, run_id, name).is_dir():
        return {"after.ollama_status": "", "ready": False}
    models = server_models(host)
    if models is None:
        return {
            "after.ollama_status": f"No Ollama server answers at {code_span(host)}: run the `ollama create` command "
            "above where Ollama runs, or give the address of one.",
            "ready": False,
        }
    return {
        "after.ollama_status": f"Ollama answers at {code_span(host)} ({len(models)} model{'s' * (len(models) != 1)}).",
        "ready": True,
    }


def create_in_ollama(view: AfterView, run_id: str, name: str, host: str) -> Iterator[dict]:
    """Upload the export's GGUF to the Ollama server at `host` and create its model; yield progress, then the model's
    name and how to run it."""
    host = host.strip() or default_host()
    if not NAME_PATTERN.match(name or ""):
        raise AfterError("folder name: use letters, digits, '.', '_' and '-' (up to 64), e.g. model-q4")
    folder = _export_dir(view, run_id, name)
    done = {}
    for event in in_background(lambda on_event: done.update(create_model(folder, host, _events(on_event))), bar=True):
        yield {"after.ollama_status": as_text(event)}
    model = done["model"]
    yield {
        "after.ollama_status": f"✓ created {code_span(model)} in Ollama at {code_span(host)}, with the Modelfile's "
        f"template and stop tokens: {code_span(f'ollama run {model}')}"
    }


def _export_dir(view: AfterView, run_id: str, name: str) -> Path:
    return view.manager.run_dir(run_id) / GGUF_DIR / name


def _events(on_event):
    """create_model's say(stage, done, total) as the worker's progress events that in_background reads."""
    return lambda stage, done, total: on_event({"event": "progress", "stage": stage, "done": done, "total": total})


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


def checks_markdown(reports: list[dict]) -> str:
    """Each export check as "24/24 answers identical after export" for what it checked, or what differs and why: its
    flags (a chat template or EOS that did not travel), then the first differing answers with their first differing
    token. "" without checks."""
    parts = []
    for report in reports:
        same, total, flags = report["identical"], report["prompts"], report["flags"]
        where = code_span(Path(report["source"]).name or report["source"])
        rows = f"held-out rows of {where}" if report["held_out"] else f"training rows of {where} (none held out)"
        lines = [
            f"{'✓' if same == total and not flags else '⚠'} {code_span(Path(report['target']).name)}: "
            f"**{same}/{total} answers identical after export** (greedy answers to {rows}, beside the adapter's)"
        ]
        lines += [f"- ⚠ {as_text(flag)}" for flag in flags]
        lines += [
            f"- {code_span(diff['prompt'][:80])} differs from token {diff['first_differing_token']}: adapter "
            f"{code_span(diff['adapter'][:80] or '(nothing)')}, exported {code_span(diff['exported'][:80] or '(nothing)')}"
            for diff in report["differing"][:DIFFERENCES_SHOWN]
        ]
        if len(report["differing"]) > DIFFERENCES_SHOWN:
            more = len(report["differing"]) - DIFFERENCES_SHOWN
            lines.append(f"- and {more} more ({code_span('tunedeck check-export RUN TARGET --json')} lists them all)")
        parts.append(lines[0] + ("\n\n" + "\n".join(lines[1:]) if lines[1:] else ""))
    return "".join("\n\n" + part for part in parts)
