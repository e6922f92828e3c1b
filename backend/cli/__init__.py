"""`tunedeck` command line: one parser, subcommands registered by the modules that own them.

Each command module exposes `register(subparsers)` and keeps its heavy imports inside
the handlers, so `tunedeck presets` starts in a fraction of a second. The console script
(tunedeck/__main__.py) adds the panel's `ui`; the CLI itself never imports the panel.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# The CLI's own commands, in `tunedeck --help` order.
COMMAND_MODULES = [
    "tunedeck.backend.cli.spec",  # presets, schema, validate, export, check
    "tunedeck.backend.cli.train",  # train
    "tunedeck.backend.cli.runs",  # runs
    "tunedeck.backend.cli.sweep",  # sweep
    "tunedeck.backend.cli.estimate",  # estimate
    "tunedeck.backend.cli.preview",  # preview
    "tunedeck.backend.cli.chat",  # chat
    "tunedeck.backend.cli.after",  # eval
    "tunedeck.backend.cli.export",  # merge, push, export-gguf, check-export
]


def build_parser(command_modules: list[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunedeck",
        description="Control panel and CLI for distributed LLM fine-tuning (DDP, DeepSpeed ZeRO, FSDP).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules:
        importlib.import_module(name).register(sub)
    return parser


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """SPEC plus repeatable --set, shared by every command that takes a job."""
    parser.add_argument("spec", metavar="SPEC", help="a preset id (see `tunedeck presets`) or a job YAML file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override one field, e.g. --set strategy.kind=zero2 (repeatable); what it implies is set too, as the "
        "page's form does, and said on stderr",
    )
    parser.add_argument(
        "--no-implied",
        dest="implied",
        action="store_false",
        help="keep the --set values as given: do not set what they imply (validation then warns)",
    )


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """--gpu-mem and --cpu-mem: the machine a job is checked against (backend/estimate/hardware.py), as in the page."""
    parser.add_argument(
        "--gpu-mem",
        metavar="GB",
        help="memory of one GPU in GB, or a GPU name such as A100-80GB or RTX4090 "
        "(default: this machine's smallest GPU by NVML, else 80)",
    )
    parser.add_argument(
        "--cpu-mem",
        metavar="GB",
        type=float,
        help="host RAM per machine, for loading the model and offloaded states "
        "(default: this machine's RAM when it has GPUs, else not checked)",
    )


def machine_or_exit(args: argparse.Namespace):
    """The Machine for --gpu-mem/--cpu-mem (or this machine's facts), or print the bad flag and exit 2."""
    from tunedeck.backend.estimate import MachineValueError, machine_facts

    try:
        return machine_facts(args.gpu_mem, args.cpu_mem)
    except MachineValueError as exc:
        print_problems([("error", "--gpu-mem" if exc.which == "gpu" else "--cpu-mem", str(exc))])
        raise SystemExit(2) from None


def load_spec_or_exit(args: argparse.Namespace):
    """Resolve SPEC and --set, or print each problem (field and fix) and exit 2.

    The --set fields imply others by the page's own rules (backend/spec/implied.py: a full fine-tune moved to FSDP
    checkpoints activations with FSDP's wrapper, not the Trainer's), set here too and said on stderr, as the
    page's notice says them; --no-implied keeps the values as given.
    """
    from tunedeck.backend.spec import SpecError, resolve_spec

    try:
        spec = resolve_spec(args.spec, args.overrides)
        if getattr(args, "implied", True) and args.overrides:
            spec = with_implied(spec, {item.partition("=")[0].strip() for item in args.overrides})
        return spec
    except SpecError as exc:
        print_problems([(p.level, p.field, p.message) for p in exc.problems])
        raise SystemExit(2) from None


def with_implied(spec, changed: set[str]):
    """`spec` with what its `changed` fields imply, said on stderr."""
    from tunedeck.backend.spec import apply_implied as implied
    from tunedeck.backend.spec import describe, flat_values, set_paths

    _, applied = implied(flat_values(spec), changed)
    if not applied:
        return spec
    print(f"{describe(applied, code=False)} (--no-implied keeps the values as given)", file=sys.stderr)
    return set_paths(spec, {path: value for found in applied for path, value in found.changes.items()})


def print_problems(rows) -> None:
    """rows: (level, field, message) triples, printed one per line to stderr."""
    for level, field, message in rows:
        print(f"{level}: {field or 'spec'}: {message}", file=sys.stderr)


def main(argv: list[str] | None = None, command_modules: list[str] = COMMAND_MODULES) -> int:
    args = build_parser(command_modules).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tunedeck presets | head`
        return 0


if __name__ == "__main__":  # the CLI alone; `python -m tunedeck` adds the panel
    raise SystemExit(main())
