"""The panel's memory view: what the table, the chart and the advice show."""

from __future__ import annotations

import pytest

from app.estimate_view import (
    HEADERS,
    estimate_figure,
    estimate_table,
    measured_markdown,
    recommendation_markdown,
)
from backend.estimate import TERMS, compare_strategies, estimate
from backend.spec import load_presets, set_paths

PRESETS = load_presets()


@pytest.fixture
def lora13b():
    return PRESETS["13b-lora-fsdp"].build()


def test_table_has_one_row_per_strategy_with_marks(lora13b):
    headers, rows = estimate_table(lora13b, 24)
    assert headers == HEADERS
    options = compare_strategies(lora13b, 24)
    assert [r[0].split(" (")[0] for r in rows] == [o.strategy for o in options]
    assert sum("current" in r[0] for r in rows) == 1 and sum("★ recommended" in r[0] for r in rows) == 1
    current = next(r for r in rows if "current" in r[0])
    assert current[1] == pytest.approx(estimate(lora13b).per_gpu_gb, abs=0.01)
    assert {r[2] for r in rows} <= {"yes", "no"} and all(r[5] in TERMS.values() for r in rows)


def test_figure_stacks_one_bar_per_strategy_and_marks_capacity(lora13b):
    fig = estimate_figure(lora13b, 24)
    options = compare_strategies(lora13b, 24)
    assert fig.layout.barmode == "stack"
    names = {trace.name for trace in fig.data}
    assert {"Weights", "Activations", "LoRA adapter"} <= names <= set(TERMS.values())
    for trace in fig.data:
        assert trace.type == "bar" and len(trace.x) == len(options)
    # The stacked segments of each bar add up to that strategy's estimate.
    for i, option in enumerate(options):
        assert sum(trace.y[i] for trace in fig.data) == pytest.approx(option.estimate.per_gpu_gb)
    lines = [shape.y0 for shape in fig.layout.shapes]
    assert 24 in lines and pytest.approx(0.9 * 24) in lines


def test_recommendation_changes_with_gpu_memory_and_model(lora13b):
    big = recommendation_markdown(lora13b, 80)
    small = recommendation_markdown(lora13b, 24)
    assert "**Recommended: DDP.**" in big and "`strategy.kind` → `ddp`" in big
    assert "**Keep FSDP FULL_SHARD.**" in small
    tiny_model = recommendation_markdown(set_paths(lora13b, {"model.name_or_path": "Qwen/Qwen2.5-0.5B"}), 24)
    assert "**Recommended: DDP.**" in tiny_model
    assert len({big, small, tiny_model}) == 3


def test_nothing_fits_is_said_plainly():
    spec = set_paths(PRESETS["7b-full-zero2"].build(), {"model.name_or_path": "meta-llama/Llama-2-70b-hf", "dataset.max_seq_length": 65536})
    text = recommendation_markdown(spec, 16, cpu_mem_gb=64)
    assert "**Nothing fits.**" in text and "dataset.max_seq_length" in text


def test_unknown_model_gives_messages_not_tracebacks(lora13b):
    spec = set_paths(lora13b, {"model.name_or_path": "someone/private-model"})
    assert "Memory estimate unavailable" in recommendation_markdown(spec, 24)
    assert estimate_table(spec, 24) == (HEADERS, [])
    fig = estimate_figure(spec, 24)
    assert not fig.data and "does not know the architecture" in fig.layout.annotations[0].text
    assert "GPU memory" in recommendation_markdown(lora13b, "banana")


def test_measured_peaks_shown_beside_the_prediction(lora13b):
    est = estimate(lora13b)
    peaks = {"allocated": [est.allocated_gb * 1.1, est.allocated_gb * 0.9], "reserved": [est.reserved_gb]}
    text = measured_markdown(lora13b.model_dump(mode="json"), peaks)  # a run's job.yaml as a dict
    assert "rank 0" in text and "rank 1" in text and "+10%" in text and "-10%" in text
    assert "Measured peak reserved" in text and "+0%" in text
    assert "No GPU peaks measured" in measured_markdown(lora13b, {})
    assert "unavailable" in measured_markdown({"method": "nonsense"}, peaks)
