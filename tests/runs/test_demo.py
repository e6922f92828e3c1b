"""The demo assets: built deterministically, without downloads, in every dataset format."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tunedeck.backend.data.demo import FORMATS, PACKAGE_DIR, build_stamp, is_built


def digests(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow  # builds the demo model and data
def test_demo_build_is_deterministic(demo_home, tmp_path):
    # A second build, in a fresh process with networking to the hub disabled, gives the same bytes.
    other = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tunedeck.backend.data.demo", "--home", str(other)],
        cwd=PACKAGE_DIR,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert is_built(other)
    assert digests(other) == digests(demo_home)


def test_demo_contents(demo_home):
    build = json.loads((demo_home / "BUILD").read_text())
    assert build["stamp"] == build_stamp()
    assert 100_000 < build["parameters"] < 1_000_000  # "a few hundred thousand"
    config = json.loads((demo_home / "model" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == build["vocab_size"]
    assert (demo_home / "model" / "chat_template.jinja").read_text().count("generation") >= 2
    train = [json.loads(line) for line in (demo_home / "data" / "train.jsonl").read_text().splitlines()]
    assert len(train) >= 1000 and set(train[0]) == {"prompt", "completion"}
    expected_columns = {
        "text": {"text"},
        "prompt-completion": {"prompt", "completion"},
        "messages": {"messages"},
        "alpaca": {"instruction", "input", "output"},
        "preference": {"prompt", "chosen", "rejected"},
        "unpaired-preference": {"prompt", "completion", "label"},
        "prompt-only": {"prompt", "answer"},
    }
    for fmt in FORMATS:
        first = json.loads((demo_home / "formats" / f"{fmt}.jsonl").read_text().splitlines()[0])
        assert set(first) == expected_columns[fmt]
    # The DPO demo's pairs: the answer chosen over the question restated, train and validation splits.
    for split in ("train", "validation"):
        pairs = [json.loads(line) for line in (demo_home / "preference" / f"{split}.jsonl").read_text().splitlines()]
        assert len(pairs) >= 150
        assert all(p["chosen"] != p["rejected"] and p["rejected"].strip() in p["prompt"] for p in pairs)
        # The KTO demo's: each pair gives one answer, good or bad, never both (unpaired); half of them good.
        rated = [json.loads(line) for line in (demo_home / "unpaired" / f"{split}.jsonl").read_text().splitlines()]
        assert [r["prompt"] for r in rated] == [p["prompt"] for p in pairs]
        assert {r["completion"] for r in rated if r["label"]} <= {p["chosen"] for p in pairs}
        assert {r["completion"] for r in rated if not r["label"]} <= {p["rejected"] for p in pairs}
        assert abs(sum(r["label"] for r in rated) - len(rated) / 2) <= 1


def test_tokenizer_and_chat_template(demo_home):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
    text = "Q: Add the numbers. 37 + 58\nA: 95"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Digits are single tokens: the arithmetic stays learnable for a tiny model. (A text begins with
    # SentencePiece's word mark, a token of its own before a digit, as in Llama's tokenizer.)
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("12345", add_special_tokens=False)["input_ids"])
    assert pieces == ["▁", "1", "2", "3", "4", "5"]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Reverse the letters. a b c"}, {"role": "assistant", "content": "c b a"}],
        tokenize=False,
    )
    assert chat == "<|user|>\nReverse the letters. a b c</s>\n<|assistant|>\nc b a</s>\n"
