"""The activation term against what autograd really saves for a transformers Llama with PEFT's LoRA, on CPU.

bench/memory_probe.py builds tiny random-weight models with the installed transformers and PEFT, counts every
tensor saved for the backward pass once per storage, and takes one decoder layer's share. The old term counted
every input a backward could use (the frozen base's too) and over-predicted a LoRA layer by about 30%.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # imports transformers and PEFT and runs six small forwards: about 15 s of CPU


def _probe():
    spec = importlib.util.spec_from_file_location("memory_probe", ROOT / "bench" / "memory_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_probe"] = module
    spec.loader.exec_module(module)
    return module


probe = _probe()


@pytest.mark.parametrize("case", ["full fine-tuning", "LoRA q,v", "LoRA all-linear"])
def test_one_layer_keeps_what_the_model_counts(case):
    method, dropout, targets = probe.CASES[case]
    measured = probe.measured_layer_bytes(method, dropout, targets)
    predicted = probe.predicted_layer_bytes(method, dropout, targets)
    assert predicted == pytest.approx(measured, rel=0.05), f"{case}: measured {measured:.0f}, model {predicted:.0f}"


def test_lora_dropout_adds_its_mask_as_the_cpu_keeps_it():
    method, dropout, targets = probe.CASES["LoRA q,v, dropout 0.05"]
    measured = probe.measured_layer_bytes(method, dropout, targets)
    assert probe.predicted_layer_bytes(method, dropout, targets, mask_bytes=4) == pytest.approx(measured, rel=0.05)
