"""`tunedeck preview`: the demo's rows as the model sees them, and their token lengths."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.cli import main
from tunedeck.backend.spec.presets import demo_home

pytestmark = [pytest.mark.slow]  # imports datasets and transformers, tokenizes 2,000 rows


def preview_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["preview", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_preview_of_the_demo_in_two_formats_and_a_missing_file(capsys):
    code, result = preview_json(capsys, "demo", "--rows", "2")
    assert code == 0 and len(result["rows"]) == 2
    assert result["rows"][0].startswith("Q: ") and result["rows"][0].endswith("</s>")  # prompt + completion + EOS
    s = result["stats"]
    assert result["counted"] == "tokens" and "demo/model" in result["tokenizer"]
    assert s["rows"] == result["rows_in_split"] == 2000 and s["max_seq_length"] == 64
    assert 5 < s["p50"] <= s["p95"] <= s["max"] < 64 and s["truncated"] == 0
    assert 0 <= s["padding_waste_packed"] < s["padding_waste"] < 0.5

    messages = str(demo_home() / "formats" / "messages.jsonl")
    code, chat = preview_json(
        capsys, "demo", "--rows", "1", "--set", f"dataset.path={messages}", "--set", "dataset.format=messages"
    )
    assert code == 0 and "Subtract the numbers" in chat["rows"][0]
    assert chat["rows"][0].startswith("<|user|>\n") and "<|assistant|>\n1</s>" in chat["rows"][0]  # the chat template

    code, missing = preview_json(capsys, "demo", "--set", "dataset.path=/nonexistent/train.jsonl")
    assert code == 2 and missing["error"]["field"] == "dataset.path"
    assert "/nonexistent/train.jsonl" in missing["error"]["message"]
