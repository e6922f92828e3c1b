"""`tunedeck export-gguf RUN --quant q4_k_m`: a run as GGUF files for llama.cpp, Ollama and LM Studio, with a Modelfile;
`tunedeck check-export RUN TARGET`: whether a merged folder or a GGUF answers as the adapter does.

The work happens in the model worker (backend/after/gguf_export.py), as for merge; this module picks the run, its
weights and the folder (so a wrong flag fails at once), prints the worker's progress on stderr and what was written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tunedeck.backend.cli.after import Progress, add_run_arguments, handled, resolve_run

GGUF_DIR = "gguf"  # under the run folder: where exports go when -o is not given


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-gguf",
        help="merge a run's adapter and write GGUF files (llama.cpp's converter and quantizer) and an Ollama Modelfile",
    )
    add_run_arguments(p, required=False)  # --fetch-converter needs no run
    p.add_argument(
        "--quant",
        action="append",
        metavar="TYPE",
        help="f16, bf16, q8_0, q4_k_m or q5_k_m; repeat or give a comma list (default: q4_k_m)",
    )
    p.add_argument(
        "-o",
        "--output",
        dest="out_dir",
        type=Path,
        metavar="DIR",
        help=f"a new folder for the files (default: <run>/{GGUF_DIR}/<adapter>, e.g. <run>/{GGUF_DIR}/final)",
    )
    p.add_argument(
        "--fetch-converter",
        action="store_true",
        help="only download llama.cpp's converter for the installed llama-cpp-python (needs PyPI) and say where; "
        "RUN is not needed",
    )
    p.set_defaults(handler=cmd_export_gguf)

    p = sub.add_parser(
        "check-export",
        help="replay held-out prompts (greedy) through the adapter and an exported model as it will be served; "
        "say how many answers agree and what did not travel",
    )
    add_run_arguments(p)
    p.add_argument("target", type=Path, metavar="TARGET", help="a merged model folder or a .gguf file")
    p.add_argument("--prompts", type=int, default=24, metavar="N", help="held-out prompts to replay (default 24)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(handler=cmd_check_export)


def cmd_export_gguf(args: argparse.Namespace) -> int:
    return handled(lambda: _export(args))


def _export(args) -> int:
    from tunedeck.backend.after import check_output_dir, llama_cpp_converter, parse_quants, run_task
    from tunedeck.backend.runs import AfterError, RunManager

    if args.fetch_converter:
        print(f"llama.cpp's converter: {llama_cpp_converter()}")
        return 0
    if not args.run_id:
        raise AfterError("RUN: name the run to export (`tunedeck runs` lists them)")
    quants = parse_quants(",".join(args.quant or ["q4_k_m"]))
    runs_dir, job, weights = resolve_run(args)
    out_dir = args.out_dir or RunManager(runs_dir).run_dir(args.run_id) / GGUF_DIR / weights.name
    out_dir = check_output_dir(out_dir)  # before anything loads
    progress = Progress()
    request = {"run_id": args.run_id, "checkpoint": weights.step, "out_dir": str(out_dir), "quants": quants}
    result = run_task("export_gguf", request, job, runs_dir, progress)
    progress.close()
    print(f"exported {weights.describe()} of run {args.run_id} to {result['out_dir']}:")
    for quant, made in result["files"].items():
        meta = made["metadata"]
        stops = ", ".join(meta[k]["text"] for k in ("eos_token", "eot_token") if k in meta) or "none"
        template = "its chat template" if meta.get("chat_template") else "no chat template"
        print(f"  {made['file']}  {made['bytes'] / 2**20:.1f} MiB  ({quant}; {template}; stops at {stops})")
    modelfile = result["modelfile"]
    print(f"  Modelfile  FROM {modelfile['from']}, {modelfile['prompt_format']} prompt format")
    if modelfile.get("note"):
        print(f"  note: {modelfile['note']}")
    print(f"run it in Ollama: {result['ollama_create']}")
    return 0


def cmd_check_export(args: argparse.Namespace) -> int:
    return handled(lambda: _check(args))


def _check(args) -> int:
    import json

    from tunedeck.backend.after import run_task
    from tunedeck.backend.runs import AfterError

    if args.prompts < 1:
        raise AfterError("--prompts: give a positive number of held-out prompts")
    target = args.target.expanduser().resolve()
    if not target.exists():
        raise AfterError(f"TARGET: {target} does not exist; give a merged model folder or a .gguf file")
    runs_dir, job, weights = resolve_run(args)
    progress = Progress()
    request = {"run_id": args.run_id, "checkpoint": weights.step, "target": str(target), "prompts": args.prompts}
    report = run_task("check_export", request, job, runs_dir, progress)
    progress.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(report["summary"])
    for diff in report["differing"]:
        print(
            f"  differs from token {diff['first_differing_token']}: {diff['prompt'][:60]!r} -> "
            f"adapter {diff['adapter'][:40]!r}, exported {diff['exported'][:40]!r}"
        )
    return 0
