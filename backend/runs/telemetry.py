"""Every machine of a run, as its telemetry files say (backend/recipe/telemetry.py writes telemetry/<host>.jsonl
from the first process on each machine): the newest reading per machine, one line each for `tunedeck runs show`
and the GPUs tab, and the warnings the run's state line carries: a GPU slowed against its will (throttled), one
with uncorrected ECC errors or an XID, one idle while the run's other GPUs work.

Read incrementally (one JsonlTail per file), so polling a long run costs the same at any step.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.backend.recipe.records import TELEMETRY_DIR  # the recipe's name
from tunedeck.backend.runs.tail import JsonlTail

KEPT = 12  # readings kept per machine: the idle check looks at the newest few
IDLE_PCT, BUSY_PCT, IDLE_READINGS = 10.0, 50.0, 3  # idle: under 10% for 3 readings while the others' median is 50+


@dataclass
class Machine:
    host: str
    readings: deque = field(default_factory=lambda: deque(maxlen=KEPT))
    xids: dict[int, list[int]] = field(default_factory=dict)  # every XID seen since the run began, by GPU

    @property
    def latest(self) -> dict:
        return self.readings[-1]


class RunTelemetry:
    """The machines of one run folder; read() takes in what their files gained since the last call."""

    def __init__(self, run_dir: Path | str):
        self.folder = Path(run_dir) / TELEMETRY_DIR
        self._tails: dict[Path, JsonlTail] = {}
        self.machines: dict[str, Machine] = {}

    def read(self) -> bool:
        """Take in the readings the files gained; True when there were any."""
        new = False
        try:
            paths = sorted(self.folder.glob("*.jsonl"))
        except OSError:
            paths = []
        for path in paths:
            tail = self._tails.setdefault(path, JsonlTail(path))
            for reading in tail.read_new():
                new = True
                host = str(reading.get("host") or path.stem)
                machine = self.machines.setdefault(host, Machine(host))
                machine.readings.append(reading)
                for gpu in reading.get("gpus") or []:
                    if gpu.get("xids"):
                        machine.xids.setdefault(int(gpu.get("index", 0)), []).extend(gpu["xids"])
        return new

    def listed(self) -> list[Machine]:
        """The machines, by host name."""
        return [self.machines[host] for host in sorted(self.machines)]


def machine_line(machine: Machine) -> str:
    """'node-a · 2 x NVIDIA H100 · util 97% 95% · memory 40.0 + 39.1 of 79.6 GB each · 512 W · 64 °C · CPU 12% · RAM
    9.5 of 23.5 GB · 51.6 GB free'; the GPU part says why there is none."""
    reading = machine.latest
    gpus = reading.get("gpus") or []
    parts = [machine.host]
    if gpus:
        names = {g.get("name") for g in gpus}
        parts.append(f"{len(gpus)} x {names.pop()}" if len(names) == 1 else f"{len(gpus)} GPUs")
        parts.append("util " + " ".join(_pct(g.get("util_pct")) for g in gpus))
        total = max(g.get("memory_total_mb") or 0 for g in gpus) / 1024
        used = " + ".join(f"{(g.get('memory_used_mb') or 0) / 1024:.1f}" for g in gpus)
        parts.append(f"memory {used} of {total:.1f} GB each")
        powers = [g["power_w"] for g in gpus if g.get("power_w") is not None]
        if powers:
            parts.append(f"{sum(powers):.0f} W")
        temps = [g["temp_c"] for g in gpus if g.get("temp_c") is not None]
        if temps:
            parts.append(f"{max(temps):.0f} °C")
    else:
        parts.append(f"no GPU readings ({reading.get('gpu_error') or 'none reported'})")
    parts.append(f"CPU {reading.get('cpu_percent', 0):.0f}%")
    if reading.get("ram_total_gb"):
        parts.append(f"RAM {reading.get('ram_used_gb', 0):.1f} of {reading['ram_total_gb']:.1f} GB")
    if reading.get("disk_free_gb") is not None:
        parts.append(f"{reading['disk_free_gb']:.1f} GB free")
    return " · ".join(parts)


def _pct(value) -> str:
    return "?" if value is None else f"{value:.0f}%"


def telemetry_warnings(machines: list[Machine]) -> list[str]:
    """What the run's owner should look at, naming the machine and GPU."""
    warnings = []
    for machine in machines:
        for gpu in machine.latest.get("gpus") or []:
            where = f"GPU {gpu.get('index')} on {machine.host}"
            if gpu.get("throttle"):
                warnings.append(f"⚠ {where} is throttled ({', '.join(gpu['throttle'])})")
            if gpu.get("ecc_uncorrected"):
                warnings.append(f"⚠ {where} has {gpu['ecc_uncorrected']} uncorrected ECC errors")
        for index, xids in sorted(machine.xids.items()):
            warnings.append(f"⚠ GPU {index} on {machine.host} reported XID {', '.join(map(str, sorted(set(xids))))}")
    return warnings + _idle_warnings(machines)


def _idle_warnings(machines: list[Machine]) -> list[str]:
    """A GPU under IDLE_PCT for its last IDLE_READINGS readings while the median of the run's GPUs is BUSY_PCT+."""
    recent: dict[tuple[str, int], list[float]] = {}
    for machine in machines:
        for reading in list(machine.readings)[-IDLE_READINGS:]:
            for gpu in reading.get("gpus") or []:
                if gpu.get("util_pct") is not None:
                    recent.setdefault((machine.host, int(gpu.get("index", 0))), []).append(float(gpu["util_pct"]))
    if len(recent) < 2:
        return []
    latest = {key: values[-1] for key, values in recent.items()}
    median = statistics.median(latest.values())
    if median < BUSY_PCT:
        return []
    return [
        f"⚠ GPU {index} on {host} idles ({values[-1]:.0f}%) while the run's other GPUs work (median {median:.0f}%)"
        for (host, index), values in sorted(recent.items())
        if len(values) >= IDLE_READINGS and max(values) < IDLE_PCT
    ]


def missing_machines(machines: list[Machine], expected: int) -> str | None:
    """A run on more machines than have written telemetry here, in words; None when all have (or none was asked)."""
    if expected <= 1 or len(machines) >= expected:
        return None
    return (
        f"{len(machines)} of {expected} machines report here: the others have not written yet, or keep a run folder "
        "of their own (their readings are in its telemetry/<host>.jsonl)"
    )
