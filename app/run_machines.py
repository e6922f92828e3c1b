"""The machines of the live Slurm runs, in the GPUs tab: each machine's GPUs and host as the run's telemetry says
(backend/runs/telemetry.py reads telemetry/<host>.jsonl, which the first process on each machine writes), with what
to look at (a throttled GPU, ECC errors, an XID, an idle GPU) named above them. This machine's own live monitor is
monitor_view.py's; the nodes a Slurm job holds are elsewhere, and their readings come through the shared run
folder."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from tunedeck.app.gauges import bar, gpu_card
from tunedeck.app.untrusted_text import as_html
from tunedeck.backend.machine import GpuSample
from tunedeck.backend.runs import Machine, RunTelemetry, missing_machines, telemetry_warnings

KEPT_RUNS = 16  # run folders whose readers are kept (each holds a few readings per machine)


class RunMachines:
    """One incremental telemetry reader per run folder, shared by every browser session."""

    def __init__(self):
        self._readers: OrderedDict[Path, RunTelemetry] = OrderedDict()

    def machines(self, run_dir: Path) -> list[Machine]:
        reader = self._readers.pop(run_dir, None) or RunTelemetry(run_dir)
        self._readers[run_dir] = reader
        while len(self._readers) > KEPT_RUNS:
            self._readers.popitem(last=False)
        reader.read()
        return reader.listed()

    def html(self, title: str, run_dir: Path, expected: int) -> str:
        """A card per machine of the run under `title` (on `expected` machines), its warnings first."""
        machines = self.machines(run_dir)
        if not machines:
            return f"<div>{as_html(title)}: no readings from its machines yet.</div>"
        said = [*telemetry_warnings(machines), missing_machines(machines, expected) or ""]
        warnings = "".join(f"<div class='td-warn'>{as_html(w)}</div>" for w in said if w)
        cards = "".join(machine_card(machine) for machine in machines)
        return f"<div>{as_html(title)}:</div>{warnings}<div class='td-cards'>{cards}</div>"


def machine_card(machine: Machine) -> str:
    reading = machine.latest
    gpus = [gpu_sample(gpu) for gpu in reading.get("gpus") or []]
    inner = "".join(gpu_card(gpu, with_processes=False) for gpu in gpus) or (
        f"<div class='td-procs'>no GPU readings: {as_html(str(reading.get('gpu_error') or 'none reported'))}</div>"
    )
    cpu, used, total = reading.get("cpu_percent") or 0.0, reading.get("ram_used_gb") or 0.0, reading.get("ram_total_gb")
    host = bar("CPU", cpu / 100, f"{cpu:.0f}%") + bar(
        "RAM", used / total if total else None, f"{used:.1f} / {total or 0:.1f} GB"
    )
    return (
        f"<div class='td-card td-machine' id='machine-{as_html(machine.host)}'><b>{as_html(machine.host)}</b>"
        f"<div class='td-cards'>{inner}</div>{host}</div>"
    )


def gpu_sample(gpu: dict) -> GpuSample:
    """A telemetry reading of one GPU as the monitor's GpuSample (its processes are on that machine: not listed)."""
    return GpuSample(
        index=int(gpu.get("index", 0)),
        name=str(gpu.get("name") or "GPU"),
        utilization_pct=gpu.get("util_pct"),
        memory_used_mb=float(gpu.get("memory_used_mb") or 0.0),
        memory_total_mb=float(gpu.get("memory_total_mb") or 0.0),
        temperature_c=gpu.get("temp_c"),
        power_w=gpu.get("power_w"),
        power_limit_w=None,
    )
