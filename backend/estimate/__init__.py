"""What a job will cost before it runs: per-GPU memory in its two phases, speed and price, whether it fits, and the
advisor that compares every sensible strategy for it.

The face: the panel and the CLI import these names from `tunedeck.backend.estimate`, never its modules. The code
lives by concern: memory*.py (the memory model, term by term; memory_save.py: what a save adds), speed*.py (the step time), advisor*.py (the
strategies compared), fit.py (fits-or-not as problems), hardware.py (the machine a job is checked against).
"""

from tunedeck.backend.estimate.advisor import Advice, StrategyEstimate, advise
from tunedeck.backend.estimate.after_oom import NextStrategy, next_after_oom
from tunedeck.backend.estimate.fit import fit_problems
from tunedeck.backend.estimate.gpu_fit import FIT_FRACTION, format_gb, gpu_memory_gb, limit_sentence
from tunedeck.backend.estimate.hardware import Machine, MachineValueError, machine_facts
from tunedeck.backend.estimate.memory import TERMS, estimate
from tunedeck.backend.estimate.memory_job import EstimateError
from tunedeck.backend.estimate.memory_load import LOAD_TERMS
from tunedeck.backend.estimate.save_fit import save_problems
from tunedeck.backend.estimate.speed import Hardware, dataset_rows, hardware_for, schedule_of

__all__ = [
    "FIT_FRACTION",
    "LOAD_TERMS",
    "TERMS",
    "Advice",
    "EstimateError",
    "Hardware",
    "Machine",
    "MachineValueError",
    "NextStrategy",
    "StrategyEstimate",
    "advise",
    "dataset_rows",
    "estimate",
    "fit_problems",
    "format_gb",
    "gpu_memory_gb",
    "hardware_for",
    "limit_sentence",
    "machine_facts",
    "next_after_oom",
    "save_problems",
    "schedule_of",
]
