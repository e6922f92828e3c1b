"""The panel's memory view: what the table, the chart and the advice show."""

from __future__ import annotations

import re

import pytest

from tunedeck.app.estimate_view import (
    HEADERS,
    LOAD_MARKER,
    SPEED_HEADERS,
    Unavailable,
    by_memory,
    column_widths,
    compute_advice,
    estimate_figure,
    estimate_table,
    measured_markdown,
    option_changes,
    option_choices,
    parse_price,
    recommendation_markdown,
    table_headers,
)
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.memory import TERMS, estimate
from tunedeck.backend.estimate.memory_load import LOAD_TERMS
from tunedeck.backend.spec import flat_values, load_presets, set_paths

PRESETS = load_presets()


@pytest.fixture
def lora13b():
    return PRESETS["13b-lora-fsdp"].build()


def markdown(spec, gpu, cpu_mem_gb=None) -> str:
    return recommendation_markdown(compute_advice(spec, gpu, cpu_mem_gb))


def test_table_has_one_row_per_strategy_with_marks_and_both_phases(lora13b):
    headers, rows = estimate_table(compute_advice(lora13b, 24))
    assert headers[: len(HEADERS)] == HEADERS and headers[len(HEADERS) :] == SPEED_HEADERS[:3]  # no price: no Cost
    for shown in (headers, table_headers(priced=True)):
        widths = column_widths(shown)
        assert len(widths) == len(shown) and sum(int(w.rstrip("%")) for w in widths) == 100
    options = advise(lora13b, 24).options
    assert sorted(r[0].split(" (")[0] for r in rows) == sorted(o.strategy for o in options)
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)  # by memory per GPU
    assert sorted(r[9] for r in rows) == list(range(1, len(options) + 1))  # the advisor's speed order
    assert next(r for r in rows if r[0].split(" (")[0] == "DDP")[9] == 1
    assert sum("current" in r[0] for r in rows) == 1 and sum("★ recommended" in r[0] for r in rows) == 1
    current = next(r for r in rows if "current" in r[0])
    est = estimate(lora13b)
    phases = est.phases
    assert current[1:5] == [round(est.per_gpu_gb, 2), round(phases["load"], 2), round(phases["train"], 2), "training"]
    assert {r[5] for r in rows} <= {"yes", "no"} and all(r[8] in {*TERMS.values(), *LOAD_TERMS.values()} for r in rows)


def test_table_says_loading_limits_70b_qlora():
    _, rows = estimate_table(compute_advice(PRESETS["70b-qlora-zero3"].build(), 24))
    current = next(r for r in rows if "current" in r[0])
    assert current[4] == "loading" and current[5] == "no" and current[8] == "Weights as loaded"
    assert current[1] == current[2] > 30 > current[3]


def test_figure_stacks_training_terms_and_marks_the_load_phase(lora13b):
    advice = compute_advice(lora13b, 24)
    fig = estimate_figure(advice)
    options = [o for _, o in by_memory(advice)]  # the table's order
    assert fig.layout.barmode == "stack"
    bars = [t for t in fig.data if t.type == "bar"]
    assert {"Weights", "Activations", "LoRA adapter"} <= {t.name for t in bars} <= set(TERMS.values())
    assert all(t.orientation == "h" for t in bars)  # labels beside the bars, never across them
    for i, option in enumerate(options):  # the stacked segments of each bar add up to its training phase
        assert len(bars[0].y) == len(options)
        assert sum(t.x[i] for t in bars) == pytest.approx(option.estimate.phases["train"])
    (marker,) = [t for t in fig.data if t.type == "scatter"]
    assert marker.name == LOAD_MARKER
    assert list(marker.x) == pytest.approx([o.estimate.phases["load"] for o in options])
    lines = [shape.x0 for shape in fig.layout.shapes]
    assert 24 in lines and pytest.approx(0.9 * 24) in lines


def test_recommendation_changes_with_gpu_memory_and_model(lora13b):
    big = markdown(lora13b, 80)
    small = markdown(lora13b, 24)
    # DDP fits in 80 GB but is predicted no faster than the preset's FSDP: the job's own choice stays.
    assert "**Keep FSDP FULL_SHARD.**" in big and "as fast as DDP" in big
    assert "**Keep FSDP FULL_SHARD.**" in small
    tiny_model = markdown(set_paths(lora13b, {"model.name_or_path": "Qwen/Qwen2.5-0.5B"}), 24)
    assert "**Keep FSDP FULL_SHARD.**" in tiny_model and "2.7 GB per GPU" in tiny_model
    huge_model = markdown(set_paths(lora13b, {"model.name_or_path": "Qwen/Qwen2.5-72B-Instruct"}), 24)
    assert "Keep FSDP FULL_SHARD" not in huge_model  # 72B in 16 bit does not fit 24 GB with FSDP alone
    assert len({big, small, tiny_model, huge_model}) == 4
    assert "to load" in small and "to train" in small and "while loading" in small  # host RAM of the load


@pytest.mark.parametrize("preset", ["70b-qlora-zero3", "70b-qlora-fsdp"])
def test_recommendation_says_the_load_limits_70b_qlora_on_24_gb(preset):
    text = markdown(PRESETS[preset].build(), 24 if preset == "70b-qlora-zero3" else 30)  # 72B trains in 26.4 GB
    assert "**Loading sets the peak:** the job fits in training" in text
    assert re.search(
        r"but loading needs (39\.5|41\.1) GB per GPU: every GPU first holds the whole quantized model", text
    )
    assert "**Nothing fits.**" in text and "GPUs with at least" in text


def test_nothing_fits_is_said_plainly():
    spec = set_paths(
        PRESETS["7b-full-zero2"].build(),
        {"model.name_or_path": "meta-llama/Llama-2-70b-hf", "dataset.max_seq_length": 65536},
    )
    text = markdown(spec, 16, cpu_mem_gb=64)
    assert "**Nothing fits.**" in text and "dataset.max_seq_length" in text


def test_unknown_model_gives_messages_not_tracebacks(lora13b):
    advice = compute_advice(set_paths(lora13b, {"model.name_or_path": "someone/private-model"}), 24)
    assert isinstance(advice, Unavailable)
    assert "Memory estimate unavailable" in recommendation_markdown(advice)
    assert estimate_table(advice) == (table_headers(priced=False), [])
    fig = estimate_figure(advice)
    assert not fig.data and "does not know the architecture" in fig.layout.annotations[0].text
    assert "GPU memory" in markdown(lora13b, "banana")


def test_measured_peaks_shown_beside_the_prediction(lora13b):
    est = estimate(lora13b)
    peaks = {"allocated": [est.allocated_gb * 1.1, est.allocated_gb * 0.9], "reserved": [est.reserved_gb]}
    text = measured_markdown(lora13b.model_dump(mode="json"), peaks)  # a run's job.yaml as a dict
    assert "rank 0" in text and "rank 1" in text and "+10%" in text and "-10%" in text
    assert "Measured peak reserved" in text and "+0%" in text and "peak while training" in text
    assert "No GPU peaks measured yet" in measured_markdown(lora13b, {})
    assert "unavailable" in measured_markdown({"method": "nonsense"}, peaks)


def test_a_cpu_run_is_not_given_gpu_figures_as_its_own(demo_spec):
    text = measured_markdown(demo_spec(), {})
    assert text.startswith("**A CPU run:** no GPU memory to measure.") and "per GPU" in text
    assert "CUDA context" not in text and "Measured peak" not in text


def test_any_row_can_be_applied_by_its_strategy(lora13b):
    advice = compute_advice(lora13b, 24)
    choices = option_choices(advice)
    assert [value for _, value in choices] == [r[0].split(" (")[0] for r in estimate_table(advice)[1]]
    values = flat_values(lora13b)
    changes = option_changes(advice, "ZeRO-3", values)
    assert changes["strategy.kind"] == "zero3" and all(values[k] != v for k, v in changes.items())
    assert option_changes(advice, "FSDP FULL_SHARD", values) == {}  # the job's own
    with pytest.raises(ValueError, match="not an option"):
        option_changes(advice, "ZeRO-9", values)


def test_the_advice_says_the_predicted_speed_and_on_which_gpu(lora13b):
    assumed = markdown(lora13b, 80, 512)
    assert "**Speed on A100-80GB (assumed: type your GPU's name in the GPU box):**" in assumed
    assert "tokens/s per GPU" in assumed and "h to finish" in assumed and "dataset card" in assumed
    named = markdown(lora13b, "H100", 512)
    assert "**Speed on H100:**" in named
    _, rows = estimate_table(compute_advice(lora13b, "H100", 512))
    assert all(isinstance(r[len(HEADERS)], float) and r[len(HEADERS) + 1] > 0 for r in rows)  # step s, tokens/s


def test_a_price_per_gpu_hour_fills_the_cost_column_and_the_speed_line(lora13b):
    """The Cost column shows only once a price is given; the speed line then says what the whole job costs, the
    figure `tunedeck estimate --price-per-gpu-hour` prints (backend/estimate/speed.py: hours x price x GPUs)."""
    from tunedeck.backend.estimate.speed import hardware_for

    unpriced = compute_advice(lora13b, "H100", 512)
    headers, rows = estimate_table(unpriced)
    assert "Cost" not in headers and all(len(r) == len(headers) for r in rows)
    assert "per GPU-hour" not in recommendation_markdown(unpriced)

    priced = compute_advice(lora13b, "H100", 512, hardware_for("H100", price=2.5))
    headers, rows = estimate_table(priced)
    assert headers == HEADERS + SPEED_HEADERS and all(len(r) == len(headers) for r in rows)
    for (_, option), row in zip(by_memory(priced), rows):
        assert row[-1] == round(option.speed.hours * 2.5 * lora13b.launch.num_processes, 2) > 0
    s = priced.current_speed
    text = recommendation_markdown(priced)
    assert f"**about {s.cost:,.2f} in all** at 2.5 per GPU-hour × {lora13b.launch.num_processes} GPUs." in text


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ("-1", "-1 is negative: give the price of one GPU-hour, e.g. 2.5, or empty it"),
        ("cheap", "'cheap' is not a number: give the price of one GPU-hour, e.g. 2.5, or empty it"),
        ("nan", "'nan' is not the price of one GPU-hour: give one below 1,000,000, e.g. 2.5"),
    ],
)
def test_a_price_that_is_not_one_says_what_the_box_takes(typed, said):
    with pytest.raises(ValueError) as bad:
        parse_price(typed)
    assert str(bad.value) == said
    assert parse_price(" $2.50 ") == 2.5 and parse_price("0") == 0 and parse_price("") is None
