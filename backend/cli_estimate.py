"""`tunedeck estimate SPEC [--set ...] [--gpu-mem GB] [--json]`: memory per GPU and the advice."""

from __future__ import annotations

import argparse
import json
import sys

from tunedeck.backend.cli import add_spec_arguments, load_spec_or_exit, print_problems

DEFAULT_GPU_GB = 80.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict GPU memory per strategy and recommend the fastest that fits",
        description="Predict the peak memory per GPU of a job for every strategy (DDP, ZeRO-1/2/3 with offload, "
        "FSDP, QLoRA) and recommend the fastest that fits the GPU.",
    )
    add_spec_arguments(p)
    p.add_argument(
        "--gpu-mem",
        metavar="GB",
        help="memory of one GPU in GB, or a GPU name such as A100-80GB or RTX4090 "
        "(default: the first GPU NVML reports, else 80)",
    )
    p.add_argument(
        "--cpu-mem",
        metavar="GB",
        type=float,
        help="host RAM per machine, for loading the model and offloaded states (default: this machine's RAM)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: current (with phases: load and train GB per GPU), strategies, recommended",
    )
    p.set_defaults(handler=cmd_estimate)


def detect_gpu_memory_gb() -> tuple[float, str] | None:
    """Total memory of GPU 0 through NVML, or None on a machine without an NVIDIA GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            name = pynvml.nvmlDeviceGetName(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVMLError (no driver/GPU) or a missing library: no GPU to read
        return None
    name = name.decode() if isinstance(name, bytes) else name
    return total / 2**30, f"{name} (NVML)"


def _gpu_memory(args: argparse.Namespace) -> tuple[float, str]:
    from tunedeck.backend.advisor import gpu_memory_gb

    if args.gpu_mem is not None:
        try:
            return gpu_memory_gb(args.gpu_mem), "--gpu-mem"
        except ValueError as exc:
            print_problems([("error", "--gpu-mem", str(exc))])
            raise SystemExit(2) from None
    detected = detect_gpu_memory_gb()
    if detected is not None:
        return detected
    return DEFAULT_GPU_GB, f"no NVIDIA GPU found, assumed {DEFAULT_GPU_GB:g} GB (pass --gpu-mem)"


def _cpu_memory(args: argparse.Namespace) -> float:
    if args.cpu_mem is not None:
        if not 0 < args.cpu_mem < float("inf"):  # also nan, which every comparison would let "fit"
            print_problems(
                [("error", "--cpu-mem", f"{args.cpu_mem:g} GB of RAM: give the RAM of one machine, e.g. 256")]
            )
            raise SystemExit(2)
        return args.cpu_mem
    import psutil

    return psutil.virtual_memory().total / 2**30


def cmd_estimate(args: argparse.Namespace) -> int:
    from tunedeck.backend.advisor import advise
    from tunedeck.backend.demo import ensure_demo_if_used
    from tunedeck.backend.memory_job import EstimateError

    spec = load_spec_or_exit(args)
    ensure_demo_if_used(spec)  # the demo model's architecture is read from its built config.json
    gpu_gb, gpu_source = _gpu_memory(args)
    cpu_gb = _cpu_memory(args)
    try:
        advice = advise(spec, gpu_gb, cpu_mem_gb=cpu_gb)
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
        f"GPU memory {gpu_gb:g} GB ({gpu_source}), host RAM {advice.cpu_mem_gb:.0f} GB per machine\n\n"
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
