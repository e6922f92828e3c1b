"""The dataset as the model will see it: the first rows after the format and the chat template,
and token-length statistics against dataset.max_seq_length.

The rows come the way train_sft.py reads them (backend/recipe/train.py: load_split, to_trl_format),
so the preview is of the data the run gets: a local JSON/JSONL/CSV/Parquet file or folder, or a
hub dataset already in the local Hugging Face cache (read offline: nothing is downloaded). Each
row becomes the text SFTTrainer tokenizes: the chat template for messages, prompt + completion
otherwise, with the EOS token TRL appends. Lengths are counted with the job's own tokenizer when
it is on this machine (a local model folder or the Hugging Face cache); otherwise they are
estimated at 4 characters per token and marked so.

GRPO's rows (format prompt-only) are prompts the model answers itself: each shows as the model reads it before
writing (a chat prompt through the chat template, with the generation prompt) beside its reference answer, and the
lengths are the prompts', against grpo.max_prompt_length (a longer prompt is left out of training); the answers
are the model's own, up to grpo.max_completion_length tokens each.

It imports datasets and transformers: the panel runs it in a subprocess (`tunedeck preview --json`).
"""

from __future__ import annotations

import math
import os

from tunedeck.backend.spec import JobSpec, flat_values
from tunedeck.backend.spec.applies import applies

ROWS_MEASURED = 5000  # enough for p95 to be stable; a preview should answer in seconds
CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text with BPE tokenizers


class PreviewError(ValueError):
    """Why there is no preview, naming the field to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def length_stats(
    lengths: list[int], max_seq_length: int, batch_size: int, answer_starts: list[int | None] | None = None
) -> dict:
    """p50/p95/max, rows truncated, and the share of padding per micro-batch without and with packing; with
    `answer_starts` (the tokens before each row's answer), of the rows truncated those whose answer is cut away
    whole (`answer_lost`: the cut falls before it) and those whose answer is cut short (`answer_cut`).

    Without packing each micro-batch (rows in order) pads to its longest row, cut at max_seq_length.
    With packing each row is cut at max_seq_length first (TRL's bfd packing: pack_dataset truncates a longer
    row before it fills blocks), then the rows fill blocks of max_seq_length: at best only the last block pads.
    """
    if not lengths:
        return {"rows": 0}
    ordered = sorted(lengths)
    kept = [min(n, max_seq_length) for n in lengths]
    padded = 0
    for start in range(0, len(kept), batch_size):
        batch = kept[start : start + batch_size]
        padded += max(batch) * len(batch)
    total = sum(kept)
    packed = math.ceil(total / max_seq_length) * max_seq_length
    starts = [a for n, a in zip(lengths, answer_starts or []) if n > max_seq_length and a is not None]
    return {
        "rows": len(lengths),
        "p50": _percentile(ordered, 50),
        "p95": _percentile(ordered, 95),
        "max": ordered[-1],
        "mean": round(sum(lengths) / len(lengths), 1),
        "max_seq_length": max_seq_length,
        "truncated": sum(n > max_seq_length for n in lengths),
        "padding_waste": round(1 - total / padded, 4),
        "padding_waste_packed": round(1 - total / packed, 4),
        "answer_lost": sum(a >= max_seq_length for a in starts),
        "answer_cut": sum(a < max_seq_length for a in starts),
    }


def _percentile(ordered: list[int], q: int) -> int:
    """Nearest-rank percentile: a length some row really has."""
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def preview(spec: JobSpec, rows: int = 3, limit: int = ROWS_MEASURED) -> dict:
    """{"rows": [texts as the model sees them], "stats": length_stats, "tokenizer": ..., "counted": ...}."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local cache only: a preview never downloads
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from tunedeck.backend import recipe

    job = spec.model_dump(mode="json")
    dataset_cfg = job["dataset"]
    try:
        data = recipe.load_split(dataset_cfg, dataset_cfg.get("split") or "train")
    except recipe.JobError as exc:
        raise PreviewError("dataset.path", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; the page needs the sentence
        raise PreviewError(
            "dataset.path",
            f"{dataset_cfg['path']} could not be read here ({type(exc).__name__}: {str(exc)[:300]}); a hub dataset "
            "is previewed only once it is in the local Hugging Face cache (run the job, or `hf download --repo-type "
            "dataset NAME`)",
        ) from None
    total_rows = len(data)
    labels = label_counts(data, dataset_cfg, spec) if dataset_cfg["format"] == "unpaired-preference" else None
    data = data.select(range(min(limit, total_rows)))
    try:
        data = recipe.to_trl_format(data, dataset_cfg, "text")
    except recipe.JobError as exc:
        text = str(exc)
        raise PreviewError(text.split(":", 1)[0], text) from None
    tokenizer, tokenizer_note = _tokenizer(job)
    sequences = [_sequences(example, tokenizer) for example in data]
    counts = iter(_token_counts([text for seqs in sequences for text in seqs], tokenizer))
    lengths = [max(next(counts) for _ in seqs) for seqs in sequences]  # a pair's longer sequence is what is cut
    prefixes = [_before_answer(example, tokenizer) for example in data]
    counted = iter(_token_counts([p for p in prefixes if p is not None], tokenizer))
    answer_starts = [None if p is None else next(counted) for p in prefixes]
    texts = [_shown(example, seqs) for example, seqs in zip(data, sequences)]
    measured = {
        "dataset": dataset_cfg["path"],
        "format": dataset_cfg["format"],
        "rows": texts[:rows],
        "rows_in_split": total_rows,
        "tokenizer": tokenizer_note,
        "counted": "tokens" if tokenizer is not None else "estimated",
        "labels": labels,
        # Each measured row's tokens and the tokens before its answer (None: a text row or a prompt alone): what the
        # statistics of any max_seq_length, batch and packing are computed from (for_job), here or in the panel.
        "lengths": lengths,
        "answer_starts": answer_starts,
    }
    return for_job(measured, spec)


def for_job(measured: dict, spec: JobSpec) -> dict:
    """A measurement (preview's rows and lengths) as it reads for `spec`: the length statistics against its
    max_seq_length (GRPO: grpo.max_prompt_length) and batch, whether it packs, what it mixes in, and KTO's advice
    for its weights. Pure Python: the panel re-reads a measurement this way at every edit (backend/data/truncation.py)."""
    grpo = measured["format"] == "prompt-only"
    limit = spec.grpo.max_prompt_length if grpo else spec.dataset.max_seq_length
    batch = spec.training.per_device_train_batch_size
    stats = length_stats(measured["lengths"], limit, batch, measured.get("answer_starts"))
    if grpo:  # the prompts' lengths: the limit is grpo.max_prompt_length, the answers are the model's to write
        stats.update(
            limit_field="grpo.max_prompt_length",
            max_completion_length=spec.grpo.max_completion_length,
            num_generations=spec.grpo.num_generations,
        )
    labels = measured.get("labels")
    if labels:  # KTO: whether the job's weights balance the good and bad answers
        p = spec.preference
        labels = {
            **labels,
            "advice": weight_advice(labels["good"], labels["bad"], p.desirable_weight, p.undesirable_weight),
        }
    return {
        **measured,
        "stats": stats,
        # not DPO's (it pads pairs), nor GRPO's (the model writes the answers)
        "packing": spec.dataset.packing and applies("dataset.packing", flat_values(spec)) and not grpo,
        "labels": labels,
        "mixed": list(spec.dataset.mix),  # dataset.mix: trained on too, previewed and measured from dataset.path only
    }


def _token_counts(texts: list[str], tokenizer) -> list[int]:
    """Each text's tokens, counted with the tokenizer or estimated at CHARS_PER_TOKEN."""
    if tokenizer is None:
        return [max(1, round(len(t) / CHARS_PER_TOKEN)) for t in texts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def label_counts(data, dataset_cfg: dict, spec: JobSpec) -> dict:
    """Good and bad answers of the whole split, and whether KTO's weights balance them (weight_advice)."""
    from tunedeck.backend import recipe

    column = recipe.column(dataset_cfg, "label_field")
    values = [recipe.as_label(v) for v in data[column]] if column in data.column_names else []
    good, bad = values.count(True), values.count(False)
    p = spec.preference
    return {"good": good, "bad": bad, "advice": weight_advice(good, bad, p.desirable_weight, p.undesirable_weight)}


def weight_advice(good: int, bad: int, desirable: float, undesirable: float) -> str | None:
    """What to set when the weights leave good and bad answers out of balance: the KTO paper's rule (its eq. 8),
    desirable x good / (undesirable x bad) between 1 and 4/3, as TRL's KTOTrainer checks it (it only logs it)."""
    if not good or not bad or good == bad:
        return None
    lo_good, hi_good = bad * undesirable / good, 1.33 * bad * undesirable / good
    lo_bad, hi_bad = good * desirable / (1.33 * bad), good * desirable / bad
    if lo_good <= desirable <= hi_good or lo_bad <= undesirable <= hi_bad:
        return None
    return (
        f"{good:,} good and {bad:,} bad answers are out of balance at these weights: set "
        f"preference.desirable_weight to {lo_good:.2f}-{hi_good:.2f}, or preference.undesirable_weight to "
        f"{lo_bad:.2f}-{hi_bad:.2f} (not both; the KTO paper's rule)"
    )


def _tokenizer(job: dict):
    """(tokenizer or None, what was used, in words)."""
    name = job["model"]["name_or_path"]
    try:
        from tunedeck.backend import recipe

        return recipe.load_tokenizer(job), f"the tokenizer of {name}"
    except Exception:  # noqa: BLE001 - not on this machine (offline), gated, or no tokenizer files
        return None, (
            f"estimated at {CHARS_PER_TOKEN} characters per token: the tokenizer of {name} is not on this machine "
            "(a local model folder or the Hugging Face cache)"
        )


def _sequences(example: dict, tokenizer) -> list[str]:
    """What the model reads of one row: its text, a DPO pair's prompt with the chosen and with the rejected answer,
    or a GRPO prompt (the model writes the rest)."""
    if "prompt" in example and "completion" not in example and "chosen" not in example:
        return [_prompt_seen(example["prompt"], tokenizer)]
    if "chosen" in example:
        return [
            _as_seen({"prompt": example["prompt"], "completion": example[k]}, tokenizer) for k in ("chosen", "rejected")
        ]
    return [_as_seen(example, tokenizer)]


def _shown(example: dict, sequences: list[str]) -> str:
    """A row as the preview shows it: a pair's two sequences, a labelled answer with its label, else the text."""
    if len(sequences) == 2:
        return f"✓ chosen:\n{sequences[0]}\n\n✗ rejected:\n{sequences[1]}"
    if "label" in example:
        return f"{'✓ good' if example['label'] else '✗ bad'}:\n{sequences[0]}"
    if "prompt" in example and "completion" not in example:  # GRPO: the prompt, and what the rewards compare with
        answer = example.get("answer")
        said = "none (only your own rewards can score this prompt)" if answer is None else answer
        return f"prompt (the model writes its answers after it):\n{sequences[0]}\n\n→ reference answer: {said}"
    return sequences[0]


def _prompt_seen(prompt, tokenizer) -> str:
    """A GRPO prompt as the model reads it before its answer: a chat through the chat template with the generation
    prompt (as TRL's GRPOTrainer applies it), a text as it is."""
    if not isinstance(prompt, list):
        return str(prompt)
    if tokenizer is not None and tokenizer.chat_template:
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt) + "\nassistant:"


def _as_seen(example: dict, tokenizer) -> str:
    """The text SFTTrainer tokenizes for one row: chat template for messages (and for a prompt and completion that
    are chats), prompt + completion + EOS otherwise."""
    eos = getattr(tokenizer, "eos_token", None) or ""
    if "messages" in example:
        return _chat(example["messages"], tokenizer)
    if "prompt" in example:
        if isinstance(example["prompt"], list) and isinstance(example["completion"], list):
            return _chat(example["prompt"] + example["completion"], tokenizer)
        return f"{example['prompt']}{example['completion']}{eos}"
    return f"{example['text']}{eos}"


def _chat(messages: list, tokenizer, answer_next: bool = False) -> str:
    """A chat through the chat template (with the assistant's header after it when `answer_next`), or as lines."""
    if tokenizer is not None and tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=answer_next)
    lines = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
    return lines + ("\nassistant: " if messages else "assistant: ") * answer_next


def _before_answer(example: dict, tokenizer) -> str | None:
    """The text before a row's answer (the completion, the first assistant turn, a pair's answers): the part the
    loss is computed on begins after it. None for a row without one (a text row, a GRPO prompt)."""
    if "messages" in example:
        messages = example["messages"]
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
        if first is None:
            return None
        try:
            return _chat(messages[:first], tokenizer, answer_next=True)
        except Exception:  # noqa: BLE001 - a template that needs a user turn first: no answer start measured
            return None
    if "prompt" in example and ("completion" in example or "chosen" in example):
        prompt = example["prompt"]
        return _chat(prompt, tokenizer, answer_next=True) if isinstance(prompt, list) else str(prompt)
    return None


def measured_seq_len(stats: dict | None, packing: bool) -> int | None:
    """The sequence length the memory estimate should use: the longest row (cut at max_seq_length)
    when batches pad to their longest row; None with packing (every block is full), no stats, or a GRPO run's
    (its prompts' lengths: the estimate counts grpo's own limits)."""
    if not stats or not stats.get("rows") or packing or stats.get("limit_field"):
        return None
    return min(stats["max"], stats["max_seq_length"])
