"""The gauges of the GPUs tab, as HTML: a labelled bar, and a GPU's card (utilisation, memory, power, its
processes). Shared by this machine's live monitor (monitor_view.py) and the machines of a run (run_machines.py)."""

from __future__ import annotations

import psutil

from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.machine import GpuSample


def bar(label: str, fraction: float | None, text: str) -> str:
    width = 0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    color = "#dc2626" if width > 90 else "#f59e0b" if width > 70 else "#4f46e5"
    return (
        f'<div class="td-gauge"><div class="td-gauge-label">{as_html(label)}<span>{as_html(text)}</span></div>'
        f'<div class="td-gauge-track"><div class="td-gauge-fill" style="width:{width:.1f}%;background:{color}"></div></div></div>'
    )


def _process_label(pid: int) -> str:
    """'pid 123 · rank 0 · python' when the process is a training rank (RANK in its environment)."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
        rank = proc.environ().get("RANK")
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid} · rank {rank} · {name}" if rank is not None else f"pid {pid} · {name}"


def gpu_card(gpu: GpuSample, with_processes: bool = True) -> str:
    """with_processes: list the processes holding its memory (this machine's GPUs: their pids mean something here)."""
    mem_fraction = gpu.memory_used_mb / gpu.memory_total_mb if gpu.memory_total_mb else None
    rows = [
        bar(
            "utilisation",
            (gpu.utilization_pct or 0) / 100 if gpu.utilization_pct is not None else None,
            f"{gpu.utilization_pct:.0f}%" if gpu.utilization_pct is not None else "n/a",
        ),
        bar("memory", mem_fraction, f"{gpu.memory_used_mb / 1024:.1f} / {gpu.memory_total_mb / 1024:.1f} GB"),
    ]
    if gpu.power_w is not None:
        limit = gpu.power_limit_w
        rows.append(
            bar(
                "power",
                gpu.power_w / limit if limit else None,
                f"{gpu.power_w:.0f} W" + (f" / {limit:.0f} W" if limit else ""),
            )
        )
    temp = f" · {gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else ""
    procs = "".join(
        f"<li>{as_html(_process_label(p.pid))}" + (f" — {p.used_mb / 1024:.1f} GB" if p.used_mb else "") + "</li>"
        for p in gpu.processes
    )
    procs_html = f"<ul class='td-procs'>{procs}</ul>" if procs else "<div class='td-procs'>no processes</div>"
    procs_html = procs_html if with_processes else ""
    return f"<div class='td-card'><b>GPU {gpu.index} · {as_html(gpu.name)}</b>{temp}{''.join(rows)}{procs_html}</div>"
