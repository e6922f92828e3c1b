"""Packing is on by default (backend/spec/sections.py): it must not change what is learned.

TRL's best-fit-decreasing packing concatenates whole rows and sends their position_ids without an
attention mask; transformers 5.24 turns those into a block-diagonal mask for SDPA, so no row
attends to another and no flash-attn is needed. Proven here on the demo model, through TRL's own
dataset preparation and collator: the packed batches give the same per-token loss, on the same
tokens (prompt and user tokens masked as before), as the padded ones; and the same batches with
the boundaries dropped (one causal mask across rows) do not, so the test can tell.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # about 20 s on 2 cores: four trainers' dataset preparation and the forwards

BOUNDARIES = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def batches(demo_home, tmp_path, rows: list[dict], **config) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_length=64,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to="none",
        train_sampling_strategy="sequential",
        **config,
    )
    tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
    trainer = SFTTrainer(
        model=model(demo_home), args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    return list(trainer.get_train_dataloader())


_MODELS = {}


def model(demo_home):
    if demo_home not in _MODELS:
        import torch
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(
            demo_home / "model", attn_implementation="sdpa", dtype=torch.float32
        )
        _MODELS[demo_home] = loaded.eval()
    return _MODELS[demo_home]


def summed_loss(demo_home, batch_list: list[dict], drop: tuple[str, ...] = ()) -> tuple[float, int]:
    """Sum of the per-token cross-entropy over the trained tokens, and their number."""
    import torch

    total, count = 0.0, 0
    for batch in batch_list:
        inputs = {k: v for k, v in batch.items() if k not in drop and k != "labels"}
        labels = batch["labels"][:, 1:]
        with torch.no_grad():
            logits = model(demo_home)(**inputs).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
        )
        total, count = total + loss.item(), count + int((labels != -100).sum())
    return total, count


def read_rows(path, n: int) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


@pytest.mark.parametrize(
    "data, config",
    [
        ("data/train.jsonl", {}),  # prompt-completion: the completion only is trained
        ("formats/messages.jsonl", {"assistant_only_loss": True}),  # chat: the assistant turns only
    ],
)
def test_packed_rows_learn_exactly_what_padded_rows_do(demo_home, tmp_path, data, config):
    rows = read_rows(demo_home / data, 40)
    packed = batches(demo_home, tmp_path, rows, packing=True, **config)
    padded = batches(demo_home, tmp_path, rows, packing=False, **config)
    assert len(packed) < len(padded) and "attention_mask" not in packed[0]  # rows share sequences, no padding

    packed_loss, packed_tokens = summed_loss(demo_home, packed)
    padded_loss, padded_tokens = summed_loss(demo_home, padded)
    # The same tokens are trained (the prompt/user mask survives packing), at the same loss.
    all_tokens = sum(int((b["labels"] != -100).sum()) + int((b["labels"] == -100).sum()) for b in packed)
    assert packed_tokens == padded_tokens < all_tokens
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)

    crossing_loss, _ = summed_loss(demo_home, packed, drop=BOUNDARIES)  # one causal mask over the packed rows
    assert abs(crossing_loss - padded_loss) > 1e-3 * padded_loss
