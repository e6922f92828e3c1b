"""Export a run to GGUF for llama.cpp, Ollama and LM Studio: merged in 16 bits (or the run's dtype), converted and
quantized by llama.cpp's own tools (backend/after/gguf_tools.py), with a Modelfile for Ollama. Worker only (torch).

The folder gets <name>-<quant>.gguf for each quant asked (f16, q8_0, q4_k_m, ...), Modelfile (FROM the smallest
one), and export.json: the files with their sizes, the metadata llama.cpp reads back from each (chat template,
BOS/EOS tokens: what must travel for answers to stay the same) and the `ollama create` command. It is written under
a hidden name and renamed: a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tunedeck.backend.after import gguf_tools
from tunedeck.backend.after.examples import shared_system_message
from tunedeck.backend.after.merge import check_output_dir, merge_run, staged
from tunedeck.backend.after.modelfile import TemplateNotConvertible, modelfile_text, ollama_model
from tunedeck.backend.runs.checkpoints import AfterError, Weights
from tunedeck.backend.spec import JobSpec

# What the converter writes itself (f16: every quantization starts from it), then what llama.cpp's quantizer makes.
CONVERTED = ("f16", "bf16")
QUANTS = (*CONVERTED, *gguf_tools.QUANT_TYPES)
EXPORT_FILE = "export.json"
MODELFILE = "Modelfile"


def parse_quants(text: str | list[str]) -> list[str]:
    """The quants asked for, in QUANTS' order; AfterError naming --quant when one is unknown or none is given."""
    asked = [q.strip().lower() for q in (text.split(",") if isinstance(text, str) else text) if q.strip()]
    unknown = [q for q in asked if q not in QUANTS]
    if unknown or not asked:
        raise AfterError(f"--quant: {', '.join(unknown) or 'nothing'} is not one of {', '.join(QUANTS)}")
    return [q for q in QUANTS if q in asked]


def export_gguf(
    run_dir: Path,
    job: JobSpec,
    run_id: str,
    weights: Weights,
    quants: list[str],
    out_dir: Path,
    device: str,
    progress=None,
) -> dict:
    """Merge, convert, quantize, write the Modelfile; returns what export.json holds (+ out_dir)."""
    quants = parse_quants(quants)
    out_dir = check_output_dir(out_dir)
    say = progress or (lambda *a: None)
    gguf_tools.binding_version()  # missing pieces are said before minutes of merging
    gguf_tools.converter()
    steps = 3 + len(quants)
    with staged(out_dir, "the GGUF export") as staging:
        merged = staging / "merged"
        if job.method == "full" and weights.path is not None:  # the weights are the whole model already
            say(f"copying {weights.describe()}", 0, steps)
            shutil.copytree(weights.path, merged)
        else:
            dtype = job.model.dtype if job.model.dtype in ("bfloat16", "float16") else "float32"
            say(f"merging {weights.describe()} into the {dtype} base", 0, steps)
            merge_run(run_dir, job, run_id, weights, merged, dtype, device)
        source = "bf16" if "bf16" in quants and "f16" not in quants else "f16"
        first = staging / f"{out_dir.name}-{source}.gguf"
        say(f"converting to GGUF {source} with llama.cpp's converter", 1, steps)
        gguf_tools.convert(merged, first, source)
        made = {source: first}
        for i, quant in enumerate(q for q in quants if q not in CONVERTED):
            say(f"quantizing to {quant} with llama.cpp's quantizer", 2 + i, steps)
            made[quant] = staging / f"{out_dir.name}-{quant}.gguf"
            gguf_tools.quantize(first, made[quant], quant)
        if source not in quants:
            first.unlink()
            del made[source]
        say("writing the Modelfile", steps - 1, steps)
        info = _describe(run_dir, job, run_id, weights, made, out_dir)
        info["modelfile"] = _write_modelfile(staging, merged, run_dir, job, made)
        shutil.rmtree(merged)
        (staging / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    say("done", steps, steps)
    return {**info, "out_dir": str(out_dir)}


def _describe(run_dir: Path, job: JobSpec, run_id: str, weights: Weights, made: dict[str, Path], out_dir: Path) -> dict:
    files = {
        quant: {"file": path.name, "bytes": path.stat().st_size, "metadata": gguf_tools.metadata_of(path)}
        for quant, path in made.items()
    }
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "weights": weights.name,
        "step": weights.step,
        "method": job.method,
        "llama_cpp_python": gguf_tools.binding_version(),
        "files": files,
        "exported_at": time.time(),
        "ollama_name": _ollama_name(run_id, weights),
        "ollama_create": f"cd {out_dir} && ollama create {_ollama_name(run_id, weights)} -f {MODELFILE}",
    }


def _ollama_name(run_id: str, weights: Weights) -> str:
    return f"tunedeck-{run_id}" + ("" if weights.step is None else f"-step{weights.step}")


def _write_modelfile(folder: Path, merged: Path, run_dir: Path, job: JobSpec, made: dict[str, Path]) -> dict:
    """The Modelfile FROM the smallest file, in the run's prompt format, with the system message all its training
    conversations share (SYSTEM: Ollama sends it when a user gives none); what it holds, for export.json."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged)
    smallest = min(made.values(), key=lambda p: p.stat().st_size)
    has_chat = bool(getattr(tokenizer, "chat_template", None))

    def render(messages: list[dict], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    note = None
    system = shared_system_message(run_dir, job)
    try:
        renders = render if has_chat else None
        model = ollama_model(smallest.name, job.dataset.format, renders, tokenizer.bos_token, stops, system)
    except TemplateNotConvertible as exc:  # the GGUF still carries the template; Ollama may read it from there
        model = {**ollama_model(smallest.name, "text", None, tokenizer.bos_token, stops, system), "template": None}
        note = f"no TEMPLATE: {exc}; Ollama falls back to the chat template in the GGUF's metadata"
    (folder / MODELFILE).write_text(modelfile_text(model), encoding="utf-8")
    return {"file": MODELFILE, **model, "note": note}
