"""Spec commands: `tunedeck presets | schema | validate | export`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunedeck.backend.cli import (
    add_machine_arguments,
    add_spec_arguments,
    load_spec_or_exit,
    machine_or_exit,
    print_problems,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(handler=cmd_presets)

    p = sub.add_parser("schema", help="print the job spec's JSON Schema, or its reference in Markdown")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the field reference (docs/job-spec.md): type, default, when it applies, where it goes",
    )
    p.set_defaults(handler=cmd_schema)

    p = sub.add_parser(
        "validate",
        help="check a job and print its problems, including whether it fits the GPUs and host RAM",
        description="Check a job: its fields, their combinations, its local model and data, and whether it fits "
        "the GPU memory and host RAM (this machine's, or --gpu-mem/--cpu-mem), as the panel does.",
    )
    add_spec_arguments(p)
    add_machine_arguments(p)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("export", help="write the job's files (accelerate YAML, DeepSpeed JSON, ...) to a folder")
    add_spec_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write the bundle into")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser(
        "check",
        help="check an exported bundle with accelerate, TRL and DeepSpeed themselves (needs the training stack)",
    )
    p.add_argument("bundle", metavar="DIR", help="a folder written by `tunedeck export`")
    p.set_defaults(handler=cmd_check)


def cmd_presets(args: argparse.Namespace) -> int:
    from tunedeck.backend.spec import load_presets

    rows = []
    for preset in load_presets().values():
        spec = preset.build()
        rows.append(
            (
                preset.id,
                preset.title,
                spec.method,
                spec.strategy.kind,
                f"{spec.launch.num_processes}x{'CPU' if spec.launch.use_cpu else 'GPU'}",
                preset.description,
            )
        )
    header = ("ID", "TITLE", "METHOD", "STRATEGY", "PROCS", "DESCRIPTION")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    if args.markdown:
        from tunedeck.backend.spec import spec_markdown

        sys.stdout.write(spec_markdown())
        return 0
    from tunedeck.backend.spec import JobSpec

    print(json.dumps(JobSpec.model_json_schema(), indent=2))
    return 0


def _check(spec, machine=None) -> tuple[list, bool]:
    """The job's problems, printed; with a `machine` (backend/estimate/hardware.py) also whether it fits."""
    from tunedeck.backend.validate import has_errors, validate

    problems = validate(spec)
    if machine is not None and not has_errors(problems):
        problems = sorted(problems + _fit(spec, machine), key=lambda p: p.level != "error")
    print_problems((p.level, p.field, p.message) for p in problems)
    return problems, has_errors(problems)


def _fit(spec, machine) -> list:
    """Whether the job fits `machine` (backend/estimate/fit.py), as the page says it; nothing for an unknown model."""
    from tunedeck.backend.data import ensure_demo_if_used
    from tunedeck.backend.estimate import EstimateError, advise, fit_problems

    if spec.launch.use_cpu:
        return []
    ensure_demo_if_used(spec)
    try:
        return fit_problems(spec, advise(spec, machine.gpu_mem_gb, cpu_mem_gb=machine.ram_gb))
    except EstimateError:  # `tunedeck estimate` says why; the job may still be fine
        return []


def cmd_validate(args: argparse.Namespace) -> int:
    from tunedeck.backend.cli.preview import local_data_problems, print_with_fixes
    from tunedeck.backend.runs import preflight_problems as preflight
    from tunedeck.backend.validate import describe_global_batch, has_errors

    spec = load_spec_or_exit(args)
    machine = machine_or_exit(args)
    problems, failed = _check(spec, machine)
    if failed:
        return 2
    # What Start would refuse on, on this machine, as `tunedeck train` (default --runs-dir) and the page see it:
    # the local model, data and reward files, where the job runs, its GPUs (backend/runs/preflight.py).
    here = preflight(spec, Path("runs").resolve())
    print_problems((p.level, p.field, p.message) for p in here)
    if has_errors(here):
        return 2
    problems += here
    cut = local_data_problems(spec)  # rows cut at max_seq_length, as `tunedeck preview` and the page say it
    print_with_fixes(cut)
    problems += cut
    print(
        f"ok: {spec.method} on {spec.model.name_or_path}, {spec.strategy.kind}, "
        f"{spec.launch.num_processes} processes, {describe_global_batch(spec)}"
        + (f" ({len(problems)} warnings)" if problems else "")
        + (
            ""
            if spec.launch.use_cpu
            else f"; checked against {machine.gpu_mem_gb:g} GB per GPU ({machine.gpu_source})"
            + (f" and {machine.ram_gb:.0f} GB of host RAM" if machine.ram_gb is not None else "")
        )
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tunedeck.backend.render import bundle_files, write_bundle
    from tunedeck.backend.spec import shown

    spec = load_spec_or_exit(args)
    _, failed = _check(spec)
    if failed:
        print("nothing exported: fix the errors above", file=sys.stderr)
        return 2
    files, data = bundle_files(spec)  # the job's small local data rides in data/; README.md names what stays here
    try:
        written = write_bundle(files, Path(args.output), data.files)
    except (OSError, ValueError) as exc:  # not a folder, no permission, disk full; a NUL in the name
        print_problems(
            [
                (
                    "error",
                    "--output",
                    f"cannot write the bundle to {shown(args.output)}: {shown(exc, 200)}; give a writable folder",
                )
            ]
        )
        return 2
    for path in written:
        print(path)
    for item in data.left:
        print(
            f"note: {item.field} {shown(item.path, 200)} is not in the bundle: {item.why}; README.md says where to "
            "copy it",
            file=sys.stderr,
        )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tunedeck.backend.render import BundleCheckError, check_bundle
    from tunedeck.backend.spec import SpecError

    folder = Path(args.bundle)
    if not (folder / "job.yaml").is_file():
        print_problems([("error", "bundle", f"{folder} has no job.yaml: give a folder written by `tunedeck export`")])
        return 2
    try:
        result = check_bundle(folder)
    except SpecError as exc:
        print_problems([(p.level, f"job.yaml: {p.field}", p.message) for p in exc.problems])
        return 2
    except BundleCheckError as exc:
        print_problems([("error", "bundle", str(exc))])
        return 2
    print_problems(("warning", "installed stack", line) for line in result.warnings)
    stage = f", ZeRO-{result.zero_stage}" if result.zero_stage is not None else ""
    print(
        f"ok: accelerate starts {result.num_processes} processes ({result.processes_per_machine} per machine) "
        f"with its {result.launcher} launcher as {result.distributed_type}{stage}; "
        f"trl.{type(result.sft_config).__name__} builds{' (GPU probes assumed: this bundle is for GPUs)' if result.gpu_assumed else ''}"
    )
    return 0
