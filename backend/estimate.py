"""The memory estimate and the strategy advisor under their old import path.

The code lives in backend/memory*.py (memory per GPU per phase: loading, training) and
backend/advisor.py (strategy options, fit, recommendation); this module re-exports their
public names for callers that import `backend.estimate` (bench/gpu_peak_check.py).
"""

from tunedeck.backend.advisor import (
    FIT_FRACTION,
    GPU_MEMORY_GB,
    Advice,
    Recommendation,
    StrategyEstimate,
    advise,
    fits,
    format_gb,
    gpu_memory_gb,
    limit_sentence,
)
from tunedeck.backend.memory import PHASES, TENSOR_TERMS, TERMS, Estimate, estimate
from tunedeck.backend.memory_job import GIB, INPUT_PATHS, LOSS_IMPLEMENTATIONS, EstimateError
from tunedeck.backend.memory_load import LOAD_TERMS
from tunedeck.backend.memory_train import zero_model_state_bytes

__all__ = [
    "FIT_FRACTION", "GIB", "GPU_MEMORY_GB", "INPUT_PATHS", "LOAD_TERMS", "LOSS_IMPLEMENTATIONS", "PHASES",
    "TENSOR_TERMS", "TERMS", "Advice", "Estimate", "EstimateError", "Recommendation", "StrategyEstimate",
    "advise", "estimate", "fits", "format_gb", "gpu_memory_gb", "limit_sentence",
    "zero_model_state_bytes",
]  # fmt: skip
