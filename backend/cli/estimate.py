"""`tunedeck estimate SPEC [--set ...] [--gpu NAME] [--gpu-mem GB] [--interconnect LINK] [--lengths FILE] [--json]`:
memory per GPU, predicted speed (useful tokens/s), time and cost per strategy, and the advice."""

from __future__ import annotations

import argparse
import dataclasses
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
    p = sub.add_parser(
        "estimate",
        help="predict GPU memory per strategy and recommend the fastest that fits",
        description="Predict the peak memory per GPU of a job for every strategy (DDP, ZeRO-1/2/3 with offload, "
        "FSDP, QLoRA) and recommend the fastest that fits the GPU.",
    )
    add_spec_arguments(p)
    add_machine_arguments(p)
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="the GPU, for its memory and peak throughput together: A100-80GB, A100-40GB, H100, H200, L40S, A10G, "
        "L4, RTX 4090, RTX 3090, A6000, V100 ... (default: the first GPU NVML reports; --gpu-mem overrides the memory)",
    )
    p.add_argument(
        "--interconnect",
        choices=("nvlink", "pcie", "infiniband", "ethernet"),
        help="the link the time prediction assumes: nvlink or pcie between the GPUs of a machine (default: NVLink "
        "for SXM GPUs, else PCIe), infiniband or ethernet between machines (default: InfiniBand)",
    )
    p.add_argument(
        "--price-per-gpu-hour", metavar="PRICE", type=float, help="price of one GPU-hour, to predict the job's cost"
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="scale the predicted throughput by how your last runs on this GPU compared with their prediction",
    )
    p.add_argument("--runs-dir", default="runs", help="where your runs are, for --calibrate (default: runs)")
    p.add_argument(
        "--lengths",
        metavar="FILE",
        help="the rows' measured lengths: a `tunedeck preview SPEC --json` output, so the speed counts their padding "
        "(without it every row is assumed max_seq_length tokens long, and the output says so)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: current (with phases: load and train GB per GPU), strategies, recommended",
    )
    p.set_defaults(handler=cmd_estimate)


def _fail(flag: str, message: str):
    print_problems([("error", flag, message)])
    raise SystemExit(2)


def _lengths(path: str | None) -> dict | None:
    """The length stats of a `tunedeck preview --json` file, or None without one; exits 2 naming --lengths."""
    if path is None:
        return None
    try:
        stats = json.loads(Path(path).read_text(encoding="utf-8")).get("stats")
    except (OSError, ValueError, AttributeError) as exc:
        _fail("--lengths", f"{path} is not a readable `tunedeck preview SPEC --json` output ({exc})")
    if not isinstance(stats, dict) or not stats.get("rows"):
        _fail("--lengths", f"{path} holds no measured rows: write it with `tunedeck preview SPEC --json > {path}`")
    return stats


def _hardware(args: argparse.Namespace):
    """The GPU and links the speed prediction assumes (--gpu, NVML, a --gpu-mem name, else the assumed GPU), with --price-per-gpu-hour."""
    from tunedeck.backend.estimate import Hardware, hardware_for, machine_facts

    price = args.price_per_gpu_hour
    if price is not None and not 0 <= price < 1e6:
        _fail("--price-per-gpu-hour", f"{price:g}: give the price of one GPU-hour, e.g. 2.5")
    name = args.gpu or machine_facts().gpu_name  # this machine's GPU (NVML), if it has one
    try:
        hardware = Hardware.named(name, args.interconnect, price_per_gpu_hour=price)
    except ValueError as exc:
        if args.gpu:
            _fail("--gpu", str(exc))
        hardware = Hardware.named(None, args.interconnect, price_per_gpu_hour=price)  # an NVML GPU not in the table
    if name is None:  # nothing named or found: predict for the most common training GPU, and say so
        hardware = hardware_for(args.gpu_mem, args.interconnect, price)  # a --gpu-mem name, else the assumed GPU
    return hardware


def cmd_estimate(args: argparse.Namespace) -> int:
    from tunedeck.backend.data import ensure_demo_if_used, measured_seq_len
    from tunedeck.backend.estimate import EstimateError, advise, dataset_rows, schedule_of
    from tunedeck.backend.runs import calibration

    spec = load_spec_or_exit(args)
    ensure_demo_if_used(spec)  # the demo model's architecture is read from its built config.json
    hardware = _hardware(args)
    if args.gpu and args.gpu_mem is None:  # --gpu names the memory too; --gpu-mem overrides it
        from tunedeck.backend.spec import gpu_row

        row = gpu_row(args.gpu)
        if row is not None:  # an unknown name: machine_or_exit below says so
            args.gpu_mem = str(row[2])
    machine = machine_or_exit(args)  # the same facts as `tunedeck validate` and the page
    gpu_source = f"{hardware.gpu} (--gpu)" if args.gpu and machine.gpu_source == "given" else machine.gpu_source
    lengths = _lengths(args.lengths)
    schedule = schedule_of(spec, *dataset_rows(spec), lengths=lengths)
    calibrated = calibration(args.runs_dir, hardware.gpu)
    correction = calibrated.factor if args.calibrate and calibrated else 1.0
    if args.calibrate and calibrated and calibrated.network_gbps:  # between machines: what your runs measured
        hardware = dataclasses.replace(hardware, measured_ring_gbps=calibrated.network_gbps)
    try:
        advice = advise(
            spec,
            machine.gpu_mem_gb,
            cpu_mem_gb=machine.ram_gb,
            hardware=hardware,
            schedule=schedule,
            correction=correction,
            seq_len=measured_seq_len(lengths, spec.dataset.packing),
        )
    except EstimateError as exc:
        print_problems([("error", exc.field, str(exc))])
        return 2
    speed = {
        "gpu": hardware.gpu,
        "gpu_source": hardware.source or ("--gpu" if args.gpu else "NVML"),
        "interconnect": {
            "inside_machine": hardware.intra,
            "between_machines": hardware.inter,
            "measured_between_machines_gbps": hardware.measured_ring_gbps,
        },
        "price_per_gpu_hour": hardware.price_per_gpu_hour,
        "steps_source": schedule.steps_source,
        "lengths": "measured" if schedule.data is not None else "assumed: every row dataset.max_seq_length tokens",
        "your_runs": calibrated.to_dict() if calibrated else None,
        "calibrated": correction != 1.0,
    }
    if args.json:
        report = {"model": spec.model.name_or_path, **advice.to_dict(), "gpu_mem_source": gpu_source, "speed": speed}
        print(json.dumps(report, indent=2))
        return 0
    _print_report(spec, advice, gpu_source)
    _print_speed(advice, speed, calibrated, args.calibrate)
    return 0


def _print_report(spec, advice, gpu_source: str) -> None:
    from tunedeck.backend.estimate import LOAD_TERMS, TERMS, format_gb, limit_sentence, save_problems

    out = sys.stdout.write
    current, gpu_gb = advice.current, advice.gpu_mem_gb
    t = spec.training
    share = current.trainable_params / current.params
    if spec.objective == "grpo":  # a row is a prompt and an answer the model writes
        g = spec.grpo
        tokens = f"({g.max_prompt_length} prompt + {g.max_completion_length} answer) tokens, {g.num_generations} answers a prompt"
    else:
        tokens = f"{spec.dataset.max_seq_length} tokens"
    if spec.sequence_parallel > 1:  # Ulysses: the GPUs of a sequence read one row together
        tokens += (
            f" on {spec.sequence_parallel} GPUs per sequence ({spec.dataset.max_seq_length // spec.sequence_parallel}"
            f" tokens each), global batch {spec.global_batch_size}"
        )
    out(
        f"{spec.model.name_or_path} · {spec.method} · {spec.strategy.kind} · {spec.launch.num_processes} process(es)"
        f" · micro batch {t.per_device_train_batch_size} x {tokens}\n"
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
    save = current.save
    out(
        f"  saving: {save.how}; it adds {format_gb(save.gpu_gb)} per GPU and {format_gb(save.host_gb)} of host RAM"
        f" per machine ({format_gb(current.save_gpu_gb)} and {format_gb(current.save_host_gb)} while it saves)\n"
    )
    for problem in save_problems(spec, current, gpu_gb, advice.cpu_mem_gb):
        out(f"  {problem.level}: {problem.message}\n")
    width = max(map(len, (*LOAD_TERMS.values(), *TERMS.values())))
    for title, labels, values in (("load", LOAD_TERMS, current.load_breakdown), ("training", TERMS, current.breakdown)):
        out(f"  {title}:\n")
        for key, label in labels.items():
            if values[key] > 0:
                out(f"    {label:{width}s} {values[key]:9.3f} GB\n")
    for note in current.notes:
        out(f"  note: {note}\n")
    names = [o.strategy + (" (current)" if o.current else "") for o in advice.options]
    col = max(34, *map(len, names))
    out(
        f"\n{'STRATEGY':{col}s} {'GPU GB':>8s} {'LOAD':>7s} {'TRAIN':>7s}  {'FITS':4s} {'CPU GB':>7s} {'SAVE GB':>8s}"
        f" {'NVME GB':>8s}"
        f" {'STEP S':>8s} {'TOK/S/GPU':>10s} {'HOURS':>8s} {'COST':>9s}\n"
    )
    for name, o in zip(names, advice.options, strict=True):
        e = o.estimate
        load, train = e.phases["load"], e.phases["train"]
        out(
            f"{name:{col}s} {e.per_gpu_gb:8.1f} {load:7.1f} {train:7.1f}  {'yes' if o.fits else 'no':4s} "
            f"{e.host_gb:7.1f} {e.save_host_gb:8.1f} {e.nvme_gb:8.1f} {_speed_columns(o.speed)}\n"
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


def _speed_columns(speed) -> str:
    if speed is None:
        return f"{'-':>8s} {'-':>10s} {'-':>8s} {'-':>9s}"
    hours = f"{speed.hours:8.2f}" if speed.hours is not None else f"{'?':>8s}"
    cost = f"{speed.cost:9.2f}" if speed.cost is not None else f"{'-':>9s}"
    return f"{speed.step_time_s:8.2f} {speed.tokens_per_s_per_gpu:10,.0f} {hours} {cost}"


def _print_speed(advice, speed: dict, calibrated, applied: bool) -> None:
    """The assumptions behind the speed columns, and how the user's own runs compared."""
    out = sys.stdout.write
    if speed["gpu"] is None:
        out("\nspeed: not predicted (no peak throughput known for this GPU; pass --gpu NAME)\n")
        return
    links = speed["interconnect"]
    assumed = " (assumed: pass --gpu NAME)" if speed["gpu_source"] == "assumed" else ""
    out(
        f"\nspeed on {speed['gpu']}{assumed}, {links['inside_machine']} inside a machine, "
        f"{links['between_machines']} between machines; steps: {speed['steps_source']}\n"
    )
    if advice.current_speed is None:
        out("  the job as set runs on CPU: no speed prediction\n")
    else:  # what TOK/S/GPU counts, and where the rows' lengths come from
        current = advice.current_speed
        how = " (--lengths FILE from `tunedeck preview SPEC --json` measures them)" if current.data.assumed else ""
        out(f"  TOK/S/GPU counts the tokens trained, not padding; {current.data_sentence}{how}\n")
    if calibrated:
        out(f"  {calibrated.sentence()}" + (" (applied)" if applied else " (--calibrate applies it)") + "\n")
