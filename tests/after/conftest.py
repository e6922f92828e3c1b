"""Trained demo runs shared by the after-training tests (each trained once per session, on CPU)."""

from __future__ import annotations

import json

import pytest

from .helpers import CHAT_SYSTEM, train_demo

SIXTY_STEPS = {"training.max_steps": 60, "training.save_steps": 30}


@pytest.fixture(scope="session")
def after_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("after-runs")


@pytest.fixture(scope="session")
def demo_run(demo_home, after_runs):
    """The demo preset shortened to its first 60 steps (the preset's 600 train for a minute, to watch): LoRA,
    2 processes, DDP (checkpoints 30 and 60)."""
    return train_demo(after_runs, SIXTY_STEPS)


@pytest.fixture(scope="session")
def qlora_run(demo_home, after_runs):
    """The demo as QLoRA: the base loaded in 4 bits (bitsandbytes), 2 processes."""
    overrides = {"method": "qlora", "quantization.bits": 4, "quantization.bnb_4bit_compute_dtype": "float32"}
    return train_demo(after_runs, {**overrides, "training.max_steps": 4, "training.save_steps": 2})


@pytest.fixture(scope="session")
def chat_run(demo_home, after_runs):
    """The demo trained on conversations (the chat template): each row a system message, the previous row's
    question and answer, then its own; 8 steps, no held-out file beside."""
    rows = [json.loads(line)["messages"] for line in (demo_home / "formats" / "messages.jsonl").open()]
    system = [{"role": "system", "content": CHAT_SYSTEM}]
    path = after_runs / "chat-data" / "conversations.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"messages": system + rows[i - 1] + rows[i]}) + "\n" for i in range(len(rows))))
    data = {"dataset.format": "messages", "dataset.path": str(path), "dataset.max_seq_length": 128}
    return train_demo(after_runs, {**data, "training.max_steps": 8, "training.save_steps": 8})
