"""Trained demo runs shared by the after-training tests (each trained once per session, on CPU)."""

from __future__ import annotations

import pytest

from .helpers import train_demo


@pytest.fixture(scope="session")
def after_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("after-runs")


@pytest.fixture(scope="session")
def demo_run(demo_home, after_runs):
    """The demo preset as a user runs it: 60 steps of LoRA, 2 processes, DDP (checkpoints 30 and 60)."""
    return train_demo(after_runs, {})


@pytest.fixture(scope="session")
def zero3_run(demo_home, after_runs):
    """The demo under DeepSpeed ZeRO-3: checkpoints are parameter shards of 2 ranks."""
    return train_demo(after_runs, {"strategy.kind": "zero3", "training.max_steps": 4, "training.save_steps": 2})


@pytest.fixture(scope="session")
def fsdp_run(demo_home, after_runs):
    """The demo under FSDP2 with SHARDED_STATE_DICT: checkpoints are torch.distributed.checkpoint folders."""
    return train_demo(after_runs, {"strategy.kind": "fsdp", "training.max_steps": 4, "training.save_steps": 2})


@pytest.fixture(scope="session")
def qlora_run(demo_home, after_runs):
    """The demo as QLoRA: the base loaded in 4 bits (bitsandbytes), 2 processes."""
    overrides = {"method": "qlora", "quantization.bits": 4, "quantization.bnb_4bit_compute_dtype": "float32"}
    return train_demo(after_runs, {**overrides, "training.max_steps": 4, "training.save_steps": 2})


@pytest.fixture(scope="session")
def chat_run(demo_home, after_runs):
    """The demo trained on conversations (messages data, the chat template): 8 steps, no held-out file beside."""
    messages = {"dataset.format": "messages", "dataset.path": str(demo_home / "formats" / "messages.jsonl")}
    return train_demo(after_runs, {**messages, "training.max_steps": 8, "training.save_steps": 8})
