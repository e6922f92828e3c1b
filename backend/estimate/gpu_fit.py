"""What one GPU holds and whether an estimate fits in it: GPU memory by name, the fit rule, its sentences.

The advisor (advisor.py) weighs every strategy with `fits`; the fit problems (fit.py) and the machine's
facts (hardware.py) read the same rule and names, so the page, the CLI and Start agree on "fits".
"""

from __future__ import annotations

import re

from tunedeck.backend.estimate.memory import Estimate

# A strategy "fits" when its peak stays below this share of the GPU: the rest is headroom
# for sequence-length outliers and fragmentation spikes.
FIT_FRACTION = 0.9


def fits(est: Estimate, gpu_mem_gb: float, cpu_mem_gb: float | None = None) -> bool:
    """The larger phase below FIT_FRACTION of the GPU, and host RAM below it when it is known."""
    if cpu_mem_gb is not None and est.host_gb > FIT_FRACTION * cpu_mem_gb:
        return False
    return est.per_gpu_gb <= FIT_FRACTION * gpu_mem_gb


def limit_sentence(est: Estimate, gpu_mem_gb: float) -> str | None:
    """When loading sets the peak, say so: "the job fits in training (…), but loading needs … per GPU: how"."""
    if est.limiting_phase != "load":
        return None
    phases = est.phases
    load = f"loading needs {format_gb(phases['load'])} per GPU: {est.load_path}"
    if phases["train"] <= FIT_FRACTION * gpu_mem_gb < phases["load"]:
        return f"the job fits in training ({format_gb(phases['train'])}), but {load}"
    return f"the job needs {format_gb(phases['train'])} in training, and {load}"


def format_gb(value: float) -> str:
    """'12.3 GB', or MB below a tenth of a GB (the demo model)."""
    return f"{value:.1f} GB" if value >= 0.1 else f"{value * 1024:.0f} MB"


# Published memory of common GPUs (GB), so a GPU can be named instead of sized.
GPU_MEMORY_GB = {
    "T4": 16, "V100-16GB": 16, "V100-32GB": 32, "V100": 32, "A10": 24, "A10G": 24, "L4": 24,
    "RTX3090": 24, "RTX4090": 24, "RTX5090": 32, "A5000": 24, "A6000": 48, "L40S": 48, "L40": 48,
    "A100-40GB": 40, "A100-80GB": 80, "A100": 80, "H100": 80, "H800": 80, "H20": 96, "H200": 141,
    "B200": 180, "MI300X": 192,
}  # fmt: skip


def gpu_memory_gb(text: str | float) -> float:
    """'80', '80GB', 'A100-80GB' or 'RTX 4090' -> GB. Raises ValueError saying what is accepted."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        cleaned = text.strip().upper().replace(" ", "")
        number = re.fullmatch(r"(\d+(?:\.\d+)?)(GB|G|GIB)?", cleaned)
        if number:
            value = float(number.group(1))
        else:
            key = cleaned.removeprefix("NVIDIA").removeprefix("GEFORCE")
            value = GPU_MEMORY_GB.get(key) or GPU_MEMORY_GB.get(key.replace("-", ""))
            if value is None:
                raise ValueError(
                    f"unknown GPU {text!r}: give its memory in GB (e.g. 80) or one of {', '.join(GPU_MEMORY_GB)}"
                )
    if not 0 < value <= 4096:
        raise ValueError(f"GPU memory {value:g} GB is out of range: give the memory of one GPU, e.g. 24 or 80")
    return float(value)
