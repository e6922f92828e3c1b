"""Dataset-preview statistics, and the estimate using the measured lengths while they are the job's."""

from __future__ import annotations

from tunedeck.app.job_outputs import evaluate
from tunedeck.backend.data.preview import for_job, length_stats, measured_seq_len
from tunedeck.backend.data.truncation import measure_key
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.spec.fields import values_from_spec


def test_length_stats_against_max_seq_length():
    s = length_stats([10, 20, 30, 40, 100], max_seq_length=50, batch_size=2)
    assert (s["rows"], s["p50"], s["p95"], s["max"], s["truncated"]) == (5, 30, 100, 100, 1)
    # Batches [10, 20] [30, 40] [50]: padded to 20, 40, 50 -> 2*20 + 2*40 + 50 = 170 slots for 150 tokens.
    assert s["padding_waste"] == round(1 - 150 / 170, 4)
    # Packed: each row cut at 50 first (TRL's bfd), so 150 tokens in ceil(150/50) = 3 blocks of 50: no padding.
    assert s["padding_waste_packed"] == 0.0
    assert length_stats([10, 100], 50, 2)["padding_waste_packed"] == round(1 - 60 / 100, 4)  # 60 tokens, 2 blocks
    assert length_stats([], 64, 8) == {"rows": 0}


def test_the_estimate_uses_the_longest_row_unless_packing():
    stats = length_stats([100, 300, 700], max_seq_length=2048, batch_size=1)
    assert measured_seq_len(stats, packing=False) == 700
    assert measured_seq_len(stats, packing=True) is None and measured_seq_len(None, False) is None
    spec = resolve_spec("7b-lora-ddp")
    full, measured = advise(spec, 80), advise(spec, 80, seq_len=700)
    assert measured.current.breakdown["activations"] < full.current.breakdown["activations"]


def test_the_page_uses_measured_lengths_only_for_the_job_they_were_measured_for():
    spec = resolve_spec("7b-lora-ddp", ["dataset.packing=false"])  # packed blocks are max_seq_length long anyway
    measured = {"format": "text", "lengths": [300, 500], "answer_starts": [None, None]}
    plain = evaluate(values_from_spec(spec), "80", "")
    used = evaluate(values_from_spec(spec), "80", "", {measure_key(spec): measured})
    assert used.advice.current.per_gpu_gb < plain.advice.current.per_gpu_gb
    other = resolve_spec("7b-lora-ddp", ["dataset.packing=false", "dataset.text_field=body"])  # other data: stale
    stale = evaluate(values_from_spec(other), "80", "", {measure_key(spec): measured})
    assert stale.advice.current.per_gpu_gb == evaluate(values_from_spec(other), "80", "").advice.current.per_gpu_gb
    batch = resolve_spec("7b-lora-ddp", ["dataset.packing=false", "training.per_device_train_batch_size=4"])
    assert measure_key(batch) == measure_key(spec)  # a batch (or max_seq_length) reads the same measurement again
    assert for_job(measured, batch)["stats"]["padding_waste"] == round(1 - 800 / 1000, 4)


def test_the_preview_reads_as_rows_and_one_measure_per_line():
    from tunedeck.app.dataset_preview import preview_markdown

    result = {
        "rows": ["Q: 1 + 1\nA: 2</s>"],
        "rows_in_split": 10,
        "stats": length_stats([10, 12, 70], 64, 2),
        "packing": False,
        "tokenizer": "the tokenizer of demo",
        "counted": "tokens",
    }
    text = preview_markdown(result)
    assert "**3 of 10 rows measured**" in text and "| p50 · p95 · max | 12 · 70 · 70 tokens |" in text
    assert "64 (1 rows truncated)" in text and "the longest row (64 tokens)" in text
    assert "```\nQ: 1 + 1\nA: 2</s>\n```" in text
    error = preview_markdown({"error": {"field": "dataset.path", "message": "no <file>"}})
    assert error == r"✗ `dataset.path`: no \<file\>"
