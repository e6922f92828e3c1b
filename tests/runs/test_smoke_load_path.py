"""Regression: sharded QLoRA's load path, on the preset's smoke bundle, before the fix (after it: the presets' smoke
runs, test_smoke_presets.py).

The old load path (every quantized model loaded with device_map={"": device}, then
prepare_model_for_kbit_training) is recreated by switching the recipe's one decision
(`sharded = is_sharded_run()`, tunedeck_recipe/models.py) off in the bundle's copy.
"""

from __future__ import annotations

import pytest

from tunedeck.backend.runs.smoke import smoke_spec
from tunedeck.backend.spec import resolve_spec

from .helpers import end_record, logs_tail, start_record
from .test_gate_traps import accelerate_launch, bundle_for, launch, patch_recipe

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DECISION = "    sharded = is_sharded_run()\n"


def smoke_bundle_on_the_old_load_path(tmp_path, preset: str):
    folder = bundle_for(tmp_path, smoke_spec(resolve_spec(preset)))
    patch_recipe(folder, DECISION, "    sharded = False  # the old load path\n")
    result, _ = launch(folder, accelerate_launch(folder))
    return folder, result


def test_zero3_qlora_smoke_run_fails_on_the_old_load_path(tmp_path):
    """(The same bundle on the new path trains: the preset's smoke test, which asserts ZeRO-3, 4-bit modules, the
    gate and 3 steps.)"""
    old, result = smoke_bundle_on_the_old_load_path(tmp_path, "70b-qlora-zero3")
    assert result.returncode != 0
    error = end_record(old)["error"]
    assert "DeepSpeed Zero-3 is not compatible with passing a `device_map`" in error, error + logs_tail(old)


def test_fsdp_qlora_old_load_path_kept_fp32_copies_of_the_frozen_weights(tmp_path):
    """prepare_model_for_kbit_training upcasts embeddings, norms and lm_head to fp32: the new path keeps bf16.

    (The new path's {"bfloat16": 21} is asserted by the preset's smoke test.)
    """
    old, result = smoke_bundle_on_the_old_load_path(tmp_path, "70b-qlora-fsdp")
    assert result.returncode == 0, logs_tail(old)
    dtypes = start_record(old)["frozen_dtypes"]
    # Qwen2.5-72B shrunk to 2 layers: 2 embeddings + 5 norms + 6 q/k/v biases upcast; 14 bf16 weights stay.
    assert dtypes.get("float32", 0) == 13 and dtypes.get("bfloat16") == 14, dtypes
