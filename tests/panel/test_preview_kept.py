"""The preview's measurements of local data outlive the panel: kept on disk under what they depend on, read by the
next panel instead of measuring for seconds again; an error, or a hub dataset, is measured again each time."""

from __future__ import annotations

import json

from tunedeck.app.dataset_preview import Measurements
from tunedeck.backend.data import measure_key, measured_locally
from tunedeck.backend.spec import resolve_spec, set_paths

MEASURED = {"rows": [], "lengths": [3, 5, 8], "format": "prompt-completion"}


def test_a_local_measurement_is_read_by_the_next_panel_and_a_changed_file_is_measured_again(tmp_path, demo_home):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "Q: 1 + 1\nA:", "completion": " 2"}) + "\n")
    spec = set_paths(resolve_spec("demo"), {"dataset.path": str(data)})
    assert measured_locally(spec)  # the demo's local tokenizer and a local file
    first = Measurements(folder=tmp_path / "kept")
    first.put(measure_key(spec), MEASURED, keep=True)
    restarted = Measurements(folder=tmp_path / "kept")  # a new panel process, the same home
    assert restarted[measure_key(spec)] == MEASURED and measure_key(spec) in restarted
    data.write_text(data.read_text() + data.read_text())  # the data changed: its key did too
    assert measure_key(spec) not in Measurements(folder=tmp_path / "kept")


def test_errors_and_hub_data_are_not_kept(tmp_path, demo_home):
    kept = Measurements(folder=tmp_path / "kept")
    kept.put("a-key", {"error": {"field": "dataset.path", "message": "the preview took over 300 s"}}, keep=True)
    assert "a-key" not in Measurements(folder=tmp_path / "kept")
    hub = set_paths(resolve_spec("demo"), {"dataset.path": "someone/their-chats"})
    assert not measured_locally(hub)  # its files may change upstream under the same key
    memory_only = Measurements()
    memory_only.put("b-key", MEASURED, keep=True)
    assert memory_only["b-key"] == MEASURED and not list((tmp_path / "kept").glob("*.tmp"))
