"""The first screen: the preset `tunedeck ui` opens on, and the one line under the title that says what to do.

Without --preset the page opens on a job a newcomer can start at once (issue 31: it opened on a gated 7B job
with Start enabled on a machine without a GPU, and nothing said where to begin). On a machine without an
NVIDIA GPU that is the demo, which trains on the CPU. On a GPU machine it is the first preset, in the page's
order, whose job as written runs on the GPUs found here: its processes on this one machine's GPUs, and the
advisor's fit rule (the estimate within FIT_FRACTION of the smallest GPU, loading and offload within its RAM)
for the job as set; the demo again when none does. The line is worded for the preset the page opens on.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from tunedeck.backend.estimate import Machine, machine_facts
from tunedeck.backend.spec import Preset

DEMO = "demo"  # the preset that trains on the CPU in about a minute
START = "**▶ Start run**"  # the Start button's label (job_view.py)


@dataclass(frozen=True)
class Here:
    """This machine as the first screen needs it: its GPUs (NVML) and RAM (psutil), through the monitor."""

    machine: Machine
    gpus: int  # NVIDIA GPUs found

    @classmethod
    def of(cls, monitor) -> Here:
        machine = machine_facts(monitor=monitor)
        return cls(machine, monitor.gpu_count if machine.has_gpu else 0)

    @property
    def gpu_words(self) -> str:
        """'8x NVIDIA H100 80GB HBM3', as the presets name their machines (or '1 GPU' where NVML names none)."""
        name = escape(self.machine.gpu_name or "GPU", quote=False)
        return f"{self.gpus}x {name}" if self.gpus > 1 else f"1 {name}"


def runs_here(preset: Preset, here: Here) -> bool:
    """Whether the preset's job, as written, runs on this machine's GPUs (a CPU preset: never by this rule)."""
    from tunedeck.app.estimate_view import compute_advice
    from tunedeck.backend.estimate import Advice

    hw = preset.hardware
    if not here.gpus or hw is None or not hw.gpus:
        return False
    spec = preset.build()
    launch = spec.launch
    if launch.use_cpu or launch.num_machines != 1 or launch.num_processes > here.gpus:
        return False
    advice = compute_advice(spec, here.machine.gpu_mem_gb, here.machine.ram_gb)
    return isinstance(advice, Advice) and advice.current_fits


def first_preset(presets: list[Preset], here: Here) -> Preset:
    """The preset the page opens on without --preset: the first that runs here on its GPUs, else the demo."""
    by_id = {p.id: p for p in presets}
    found = next((p for p in presets if runs_here(p, here)), None)
    return found or by_id.get(DEMO) or presets[0]


def start_line(preset: Preset | None, here: Here) -> str:
    """The line under the title: what to do first on the job the page opens on (markdown)."""
    then = "then pick a preset or fill the forms for your own job."
    if preset is None:
        return (
            "**Start here:** pick a preset above, or fill the forms for your own job; the files, the problems and "
            "the estimate beside them follow every change."
        )
    hw = preset.hardware
    if hw is not None and not hw.gpus:  # a CPU job: it runs here, whatever this machine has
        what = "the tiny demo" if preset.id == DEMO else f"the {escape(preset.title, quote=False)} demo"
        where = "this machine's CPU" if here.gpus else "this CPU"
        line = f"**Start here:** press {START} to train {what} on {where} and watch its loss fall (about a minute); "
        if preset.id == DEMO and here.gpus:
            return line + (
                f"no preset runs as written on the {here.gpu_words} here, so then pick the closest and apply the "
                "estimate's advice, or fill the forms for your own job."
            )
        return line + then
    title = escape(preset.title, quote=False)
    if hw is None:
        return f"**Start here:** check the {title} job in the form, then press {START}; or {then}"
    if runs_here(preset, here):
        return (
            f"**Start here:** {title} runs on the {here.gpu_words} here: check the model and the data in the form, "
            f"then press {START} and watch its loss fall; or pick another preset or fill the forms for your own job."
        )
    meant = escape(hw.label, quote=False)
    if not here.gpus:
        return (
            f"**Start here:** this job is meant for {meant} and this machine has no NVIDIA GPU: download the bundle "
            "to run it there, or press **Demo (CPU)** to train the tiny demo here first."
        )
    return (
        f"**Start here:** this job is meant for {meant}; the estimate beside the form says what it needs on the "
        f"{here.gpu_words} here and what to change, or press **Demo (CPU)** to train the tiny demo first."
    )
