"""Export: `tunedeck merge RUN -o DIR` (a standalone model and serve.sh), `tunedeck push DIR` (to the Hub),
`tunedeck export-gguf RUN --quant q4_k_m` (GGUF files for llama.cpp, Ollama and LM Studio, with a Modelfile) and
`tunedeck check-export RUN TARGET` (whether a merged folder or a GGUF answers as the adapter does; `--check N` runs
it after a merge or an export).

The work happens in the model worker (backend/after/merge.py, gguf_export.py, export_check.py); this module picks the
run, its weights and the folder (so a wrong flag fails at once), prints the worker's progress on stderr and what was
written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tunedeck.backend.after import EXPORT_CHECK_PROMPTS
from tunedeck.backend.cli.after import Progress, add_run_arguments, fail, handled, resolve_run

GGUF_DIR = "gguf"  # under the run folder: where exports go when -o is not given


def add_check_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        type=int,
        nargs="?",
        const=EXPORT_CHECK_PROMPTS,
        default=0,
        metavar="N",
        help=f"then replay N held-out prompts (default {EXPORT_CHECK_PROMPTS}) through the adapter and what was written, as "
        "`tunedeck check-export` does",
    )


def positive_prompts(value: int, flag: str) -> int:
    from tunedeck.backend.runs import AfterError

    if value < 0 or (flag == "--prompts" and value == 0):
        raise AfterError(f"{flag}: give a positive number of held-out prompts")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge", help="merge a run's LoRA adapter into its base and save a standalone model (+ serve.sh)"
    )
    add_run_arguments(p)
    p.add_argument(
        "-o", "--output", dest="out_dir", type=Path, required=True, metavar="DIR", help="a new folder for the model"
    )
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="dtype of the saved weights (default: the run's model.dtype)",
    )
    add_check_argument(p)
    p.set_defaults(handler=cmd_merge)

    p = sub.add_parser(
        "push", help="upload a merged model folder to the Hugging Face Hub (token from HF_TOKEN or --token-file)"
    )
    p.add_argument("folder", type=Path, metavar="DIR")
    p.add_argument("--repo-id", required=True, metavar="OWNER/NAME")
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="a file holding a write token (default: $HF_TOKEN, or huggingface-cli login)",
    )
    p.add_argument("--public", action="store_true", help="make a new repository public (default private)")
    p.set_defaults(handler=cmd_push)

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
    add_check_argument(p)
    p.set_defaults(handler=cmd_export_gguf)

    p = sub.add_parser(
        "check-export",
        help="replay held-out prompts (greedy) through the adapter and an exported model as it will be served; "
        "say how many answers agree and what did not travel",
    )
    add_run_arguments(p)
    p.add_argument("target", type=Path, metavar="TARGET", help="a merged model folder or a .gguf file")
    p.add_argument(
        "--prompts",
        type=int,
        default=EXPORT_CHECK_PROMPTS,
        metavar="N",
        help=f"held-out prompts to replay (default {EXPORT_CHECK_PROMPTS})",
    )
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(handler=cmd_check_export)


def cmd_export_gguf(args: argparse.Namespace) -> int:
    return handled(lambda: _export(args))


def _export(args) -> int:
    from tunedeck.backend.after import check_output_dir, llama_cpp_converter, parse_quants, run_export
    from tunedeck.backend.runs import AfterError, RunManager

    if args.fetch_converter:
        print(f"llama.cpp's converter: {llama_cpp_converter()}")
        return 0
    if not args.run_id:
        raise AfterError("RUN: name the run to export (`tunedeck runs` lists them)")
    quants = parse_quants(",".join(args.quant or ["q4_k_m"]))
    check = positive_prompts(args.check, "--check")
    runs_dir, job, weights = resolve_run(args)
    out_dir = args.out_dir or RunManager(runs_dir).run_dir(args.run_id) / GGUF_DIR / weights.name
    out_dir = check_output_dir(out_dir)  # before anything loads
    progress = Progress()
    request = {"run_id": args.run_id, "checkpoint": weights.step, "out_dir": str(out_dir), "quants": quants}
    result, reports = run_export("export_gguf", request, job, runs_dir, check, progress)
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
    print_reports(reports)
    return 0


def cmd_check_export(args: argparse.Namespace) -> int:
    return handled(lambda: _check(args))


def _check(args) -> int:
    import json

    from tunedeck.backend.after import run_task
    from tunedeck.backend.runs import AfterError

    positive_prompts(args.prompts, "--prompts")
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
    print_reports([report])
    return 0


def print_reports(reports: list[dict]) -> None:
    """Each export check's line, named by what it checked when there are several, and its differing answers."""
    for report in reports:
        print(report["summary"] + (f" ({Path(report['target']).name})" if len(reports) > 1 else ""))
        for diff in report["differing"]:
            print(
                f"  differs from token {diff['first_differing_token']}: {diff['prompt'][:60]!r} -> "
                f"adapter {diff['adapter'][:40]!r}, exported {diff['exported'][:40]!r}"
            )


def cmd_merge(args: argparse.Namespace) -> int:
    return handled(lambda: _merge(args))


def _merge(args) -> int:
    from tunedeck.backend.after import check_output_dir, run_export

    check = positive_prompts(args.check, "--check")
    runs_dir, job, weights = resolve_run(args)
    out_dir = check_output_dir(args.out_dir)  # before anything loads
    dtype = args.dtype or job.model.dtype
    if job.method == "qlora":
        print(
            "QLoRA run: the adapter is merged into the base loaded in " + dtype + ", not into 4-bit weights",
            file=sys.stderr,
        )
    progress = Progress()
    request = {"run_id": args.run_id, "checkpoint": weights.step, "out_dir": str(out_dir), "dtype": dtype}
    result, reports = run_export("merge", request, job, runs_dir, check, progress)
    progress.close()
    print(f"merged {weights.describe()} of run {args.run_id} into {result['base_model']} ({dtype})")
    print(f"saved to {result['out_dir']}: {', '.join(result['files'])}")
    print(
        f"serve it: bash {Path(result['out_dir']) / 'serve.sh'}   (or `bash serve.sh adapter` for the base + adapter)"
    )
    print_reports(reports)
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from tunedeck.backend.after import push_folder

    token = None
    if args.token_file:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            return fail(f"--token-file: cannot read {args.token_file} ({exc.strerror or exc})")
    token = token or os.environ.get("HF_TOKEN")
    return handled(
        lambda: print(f"pushed to {push_folder(args.folder, args.repo_id, token, private=not args.public)}") or 0
    )
