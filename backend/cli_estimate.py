"""`tunedeck estimate SPEC [--set ...] [--gpu-mem GB] [--json]`: memory per GPU and the advice."""

from __future__ import annotations

import argparse
import json
import sys

from tunedeck.backend.cli import (
    add_machine_arguments,
    add_spec_arguments,
    load_spec_or_exit,
    machine_or_exit,
    print_problems,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict GPU memory per strategy and recommend the fastest that fits",
        description="Predict the peak memory per GPU of a job for every strategy (DDP, ZeRO-1/2/3 with offload, "
        "FSDP, QLoRA) and recommend the fastest that fits the GPU.",
    )
    add_spec_arguments(p)
    add_machine_arguments(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: current (with phases: load and train GB per GPU), strategies, recommended",
    )
    p.set_defaults(handler=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    from tunedeck.backend.advisor import advise
    from tunedeck.backend.demo import ensure_demo_if_used
    from tunedeck.backend.memory_job import EstimateError

    spec = load_spec_or_exit(args)
    ensure_demo_if_used(spec)  # the demo model's architecture is read from its built config.json
    machine = machine_or_exit(args)  # the same facts as `tunedeck validate` and the page
    gpu_source = machine.gpu_source
    try:
        advice = advise(spec, machine.gpu_mem_gb, cpu_mem_gb=machine.ram_gb)
    except EstimateError as exc:
        print_problems([("error", exc.field, str(exc))])
        return 2
    if args.json:
        report = {"model": spec.model.name_or_path, **advice.to_dict(), "gpu_mem_source": gpu_source}
        print(json.dumps(report, indent=2))
        return 0
    _print_report(spec, advice, gpu_source)
    return 0


def _print_report(spec, advice, gpu_source: str) -> None:
    from tunedeck.backend.advisor import format_gb, limit_sentence
    from tunedeck.backend.memory import TERMS
    from tunedeck.backend.memory_load import LOAD_TERMS

    out = sys.stdout.write
    current, gpu_gb = advice.current, advice.gpu_mem_gb
    t = spec.training
    share = current.trainable_params / current.params
    out(
        f"{spec.model.name_or_path} · {spec.method} · {spec.strategy.kind} · {spec.launch.num_processes} process(es)"
        f" · micro batch {t.per_device_train_batch_size} x {spec.dataset.max_seq_length} tokens\n"
        f"parameters {current.params:,}, trainable {current.trainable_params:,} ({share:.2%})\n"
        f"GPU memory {gpu_gb:g} GB ({gpu_source}), host RAM "
        + ("not checked" if advice.cpu_mem_gb is None else f"{advice.cpu_mem_gb:.0f} GB per machine")
        + "\n\n"
    )
    phases = current.phases
    out(
        f"as given: {format_gb(current.per_gpu_gb)} per GPU (load {format_gb(phases['load'])}, "
        f"training {format_gb(phases['train'])}; {'loading' if current.limiting_phase == 'load' else 'training'} "
        f"sets the peak)\n"
    )
    out(f"  {limit_sentence(current, gpu_gb) or 'loading: ' + current.load_path}\n")
    out(f"  host RAM per machine: {current.load_cpu_gb:.1f} GB while loading")
    if current.cpu_gb or current.nvme_gb:
        out(f", {current.cpu_gb:.1f} GB CPU RAM and {current.nvme_gb:.1f} GB NVMe while training")
    out("\n")
    for title, labels, values in (("load", LOAD_TERMS, current.load_breakdown), ("training", TERMS, current.breakdown)):
        out(f"  {title}:\n")
        for key, label in labels.items():
            if values[key] > 0:
                out(f"    {label:24s} {values[key]:9.3f} GB\n")
    for note in current.notes:
        out(f"  note: {note}\n")
    out(f"\n{'STRATEGY':34s} {'GPU GB':>8s} {'LOAD':>7s} {'TRAIN':>7s}  {'FITS':4s} {'CPU GB':>7s} {'NVME GB':>8s}\n")
    for o in advice.options:
        name = o.strategy + (" (current)" if o.current else "")
        e = o.estimate
        load, train = e.phases["load"], e.phases["train"]
        out(
            f"{name:34s} {e.per_gpu_gb:8.1f} {load:7.1f} {train:7.1f}  {'yes' if o.fits else 'no':4s} "
            f"{e.host_gb:7.1f} {e.nvme_gb:8.1f}\n"
        )
    rec = advice.recommendation
    out(f"\n{rec.reason}\n")
    if rec.changes:
        sets = " ".join(f"--set {k}={_cli_value(v)}" for k, v in rec.changes.items())
        out(f"apply: {sets}\n")


def _cli_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
