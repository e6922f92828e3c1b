"""What the page shows beside the form, computed from the form's values (no browser)."""

from __future__ import annotations

import io
import zipfile

from tunedeck.app.downloads import BundleWriter, zip_name_for
from tunedeck.app.job_outputs import batch_markdown, evaluate, issues_markdown
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import load_presets
from tunedeck.backend.spec.fields import values_from_spec


def preset_values(preset_id):
    return values_from_spec(load_presets()[preset_id].build())


def test_valid_preset_gives_files_and_no_problems():
    result = evaluate(preset_values("70b-qlora-zero3"))
    assert not result.has_errors
    assert result.files == render_bundle(result.spec)
    assert '"stage": 3' in result.files["ds_config.json"]
    assert "No problems" in issues_markdown(result)


def test_field_level_error_names_the_field_and_blocks():
    values = preset_values("7b-lora-ddp")
    values["lora.r"] = 0
    result = evaluate(values)
    assert result.has_errors and result.spec is None and result.files == {}
    assert "lora.r" in result.error_fields
    text = issues_markdown(result)
    assert "`lora.r`" in text and "disabled" in text


def test_cross_field_error_from_validation_is_shown():
    values = preset_values("7b-lora-ddp")
    values["strategy.offload_params"] = "cpu"  # parameter offload needs ZeRO-3 or FSDP
    result = evaluate(values)
    assert result.has_errors and "strategy.offload_params" in result.error_fields


def test_global_batch_states_its_factors():
    text = batch_markdown(preset_values("7b-lora-ddp"))
    assert "Global batch: 32" in text and "2 per device" in text and "4 processes" in text and "4 accumulation" in text
    values = preset_values("7b-lora-ddp") | {"launch.num_processes": None}
    assert "fix the batch fields" in batch_markdown(values)
    # The GPUs sharing a sequence (Ulysses, DeepSpeed only) read their rows together: the batch is per group
    ulysses = preset_values("7b-lora-ddp") | {"strategy.kind": "zero3", "strategy.sequence_parallel": 2}
    text = batch_markdown(ulysses)
    assert "Global batch: 16" in text and "× 2 sequence groups (4 processes, 2 GPUs per sequence) ×" in text
    assert "Global batch: 32" in batch_markdown(ulysses | {"strategy.kind": "ddp"})  # ignored: a warning says so
    assert "Global batch: 32" in batch_markdown(ulysses | {"strategy.sequence_parallel": 3})  # an error says why


def test_bundle_writer_writes_zip_and_files_inside_its_folder(tmp_path):
    spec = load_presets()["7b-lora-ddp"].build()
    files = render_bundle(spec)
    writer = BundleWriter(tmp_path)
    zip_path, paths = writer.write(files, zip_name_for(spec))
    assert zip_path.parent.parent == tmp_path and all(p.is_relative_to(tmp_path) for p in paths)
    assert zip_path.name == "tunedeck-Qwen2.5-7B-Instruct-lora-ddp.zip"
    with zipfile.ZipFile(io.BytesIO(zip_path.read_bytes())) as archive:
        assert archive.namelist() == list(files)
    assert [p.read_text() for p in paths] == list(files.values())
    assert writer.write(files, zip_name_for(spec))[0] == zip_path  # same job, same folder


def test_bundle_writer_refuses_names_that_are_paths(tmp_path):
    import pytest

    with pytest.raises(ValueError):
        BundleWriter(tmp_path).write({"../evil.sh": "x"})
