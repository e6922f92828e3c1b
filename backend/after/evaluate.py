"""Evaluate a run: loss and perplexity on held-out data, and exact/contains match and ROUGE-L of generated answers.

Sequences are tokenized as TRL's SFTTrainer did in training (its tokenize_fn in trl/trainer/sft_trainer.py): an EOS
appended to plain text and completions, the loss on the completion only for prompt-completion data
(completion_only_loss), on every token for text and messages. Loss: the mean over scored tokens; perplexity: exp(loss).

The data (backend/after/eval_data.py): a chosen file (in the run's dataset format), else the job's dataset.eval_split,
else the held-out file beside the training file. The base is loaded once; each adapter is put on it in turn.
Imports torch inside its functions: runs in the worker process.

Prompts without answers (a file without the completion or output column, a row without its value, a conversation
that ends with the user's turn) are answered, not scored; GRPO's prompts (prompt-only) by their answer column.
"""

from __future__ import annotations

import functools
import math
import re
import time
from pathlib import Path

from tunedeck.backend.after.eval_answers import SCORES
from tunedeck.backend.after.eval_data import eval_source, local
from tunedeck.backend.after.eval_results import order_key
from tunedeck.backend.recipe import train
from tunedeck.backend.runs.checkpoints import AfterError, Weights, list_weights

BATCH_SIZE = 8
EXTRA_NEW_TOKENS = 8  # answers may run this far past the longest expected one before they are cut
MAX_NEW_TOKENS = 256  # also how far a prompt without an answer in the data may be answered
# Where a row's answers are: a preference pair's is its chosen one (unpaired ones: the answers labelled good).
ANSWER_FIELDS = {
    "prompt-completion": ("completion_field",),
    "alpaca": ("output_field",),
    "preference": ("chosen_field", "rejected_field"),
}


class Cancelled(Exception):
    """The caller asked to stop."""


def eval_rows(
    run_dir: Path, job: dict, data_file: str | None = None, limit: int | None = None
) -> tuple[list[dict], str]:
    """(rows in TRL's columns: prompt/completion, text or messages; where they came from). Which data:
    backend/after/eval_data.py (NoEvalData when the run has none)."""
    dataset_cfg, split, source = eval_source(run_dir, job, data_file)
    return _read_rows(dataset_cfg, split, source, limit, answers_optional=True), source


def training_rows(run_dir: Path, job: dict, limit: int | None = None) -> tuple[list[dict], str]:
    """(the first rows of the run's training split in TRL's columns; where they came from)."""
    dataset_cfg = dict(job.get("dataset") or {})
    dataset_cfg["path"] = str(local(run_dir, str(dataset_cfg.get("path", ""))))
    split = dataset_cfg.get("split") or "train"
    return _read_rows(dataset_cfg, split, dataset_cfg["path"], limit, "training data"), dataset_cfg["path"]


def _read_rows(
    dataset_cfg: dict,
    split: str,
    source: str,
    limit: int | None,
    what: str = "evaluation data",
    answers_optional: bool = False,
) -> list[dict]:
    """The rows in TRL's columns; with `answers_optional`, a file of prompts alone gives rows whose completion is None."""
    try:
        dataset = train.load_split(dataset_cfg, split)
        answer_columns = _missing_answer_columns(dataset, dataset_cfg) if answers_optional else []
        for answer_column in answer_columns:
            dataset = dataset.add_column(answer_column, [""] * len(dataset))
        dataset = train.to_trl_format(dataset, dataset_cfg, "text")
        if "label" in dataset.column_names:  # answers labelled good or bad
            dataset = dataset.filter(lambda row: row["label"]).remove_columns("label")
    except train.JobError as exc:
        raise AfterError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise AfterError(f"cannot read the {what} {source}: {exc}") from None
    count = len(dataset) if limit is None else min(limit, len(dataset))
    if count == 0:
        raise AfterError(f"the {what} {source} has no rows")
    rows = [dataset[i] for i in range(count)]
    if "chosen" in dataset.column_names:  # preference pairs: the data's answer is the chosen one
        rows = [{"prompt": row["prompt"], "completion": row["chosen"], "rejected": row["rejected"]} for row in rows]
    elif "prompt" in dataset.column_names and "completion" not in dataset.column_names:  # GRPO's: its reference
        rows = [{"prompt": row["prompt"], "completion": row.get("answer")} for row in rows]
    return [{"prompt": row["prompt"], "completion": None} for row in rows] if answer_columns else rows


def _missing_answer_columns(dataset, dataset_cfg: dict) -> list[str]:
    """The answer columns a file of prompts lacks (its prompt column present, every answer column missing)."""
    fmt = dataset_cfg.get("format", "text")
    if fmt not in ANSWER_FIELDS:
        return []
    prompt_field = "instruction_field" if fmt == "alpaca" else "prompt_field"
    answers = [train.column(dataset_cfg, field) for field in ANSWER_FIELDS[fmt]]
    present = dataset.column_names
    if train.column(dataset_cfg, prompt_field) not in present or any(a in present for a in answers):
        return []
    return answers


# ---------------------------------------------------------------- tokenizing as TRL does


def _ids(tokenizer, content, generation_prompt: bool = False) -> list[int]:
    if isinstance(content, list):  # conversational
        out = tokenizer.apply_chat_template(
            content, add_generation_prompt=generation_prompt, tokenize=True, return_dict=True
        )
        return list(out["input_ids"])
    return list(tokenizer(content)["input_ids"])


def scored_sequence(tokenizer, row: dict, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, loss mask) of one row."""
    eos = tokenizer.eos_token
    if "prompt" in row:
        completion = row["completion"]
        if isinstance(completion, str) and not completion.endswith(eos):
            completion += eos
        prompt_ids = _ids(tokenizer, row["prompt"], generation_prompt=isinstance(row["prompt"], list))
        full = _ids(tokenizer, row["prompt"] + completion)
        start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), min(len(prompt_ids), len(full)))
        mask = [0] * start + [1] * (len(full) - start)
    elif "messages" in row:
        full = _ids(tokenizer, row["messages"])
        mask = [1] * len(full)
    else:
        text = row["text"] if row["text"].endswith(eos) else row["text"] + eos
        full = _ids(tokenizer, text)
        mask = [1] * len(full)
    return full[:max_length], mask[:max_length]


def has_answer(row: dict) -> bool:
    """Whether the row can be scored: plain text, or a prompt with the data's answer to it."""
    asked = question_and_answer(row)
    return "text" in row if asked is None else asked[1] is not None


def question_and_answer(row: dict) -> tuple[object, str | None] | None:
    """(prompt, the data's answer, None when it has none) of a row with a prompt to answer, else None (plain text)."""
    if "prompt" in row:
        completion = row["completion"]
        if completion is None:
            return row["prompt"], None
        expected = completion if isinstance(completion, str) else " ".join(m["content"] for m in completion)
        return row["prompt"], expected
    messages = row.get("messages") or []
    if len(messages) >= 2 and messages[-1].get("role") == "assistant":
        return messages[:-1], messages[-1]["content"]
    if messages and messages[-1].get("role") == "user":
        return messages, None
    return None


# ---------------------------------------------------------------- scoring


def exact_match(answer: str, expected: str) -> bool:
    """The same final answer (after the last '####', inside the last \\boxed{}, or all of it; numbers as numbers),
    as GRPO's exact_answer reward scores it: "so 7 #### 7" answers "7"."""
    return train.exact_answer([answer], answer=[expected]) == [1.0]


def contains_match(answer: str, expected: str) -> bool:
    return expected.strip() in answer


# CJK characters are words of their own (rouge_score's default tokenizer keeps only [a-z0-9] runs, so it would
# score every Chinese, Japanese or Korean answer 0); other text splits as it splits it.
_WORDS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W_]+")


@functools.cache
def _rouge_scorer():
    from rouge_score import rouge_scorer, tokenizers

    class Words(tokenizers.Tokenizer):
        def tokenize(self, text):
            return _WORDS.findall(text.lower())

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=Words())


def rouge_l(answer: str, expected: str) -> float:
    """ROUGE-L F1 (rouge_score's longest common subsequence of words): partial credit where exact match gives none."""
    return float(_rouge_scorer().score(expected, answer)["rougeL"].fmeasure)


def _check(cancel) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def completion_losses(model, tokenizer, rows: list[dict], max_length: int, say, cancel) -> list[tuple[float, int]]:
    """(summed loss, tokens) of each row's scored tokens: its completion (or the whole text)."""
    import torch

    device = next(model.parameters()).device
    out: list[tuple[float, int]] = []
    sequences = [scored_sequence(tokenizer, row, max_length) for row in rows]
    for start in range(0, len(sequences), BATCH_SIZE):
        _check(cancel)
        batch = sequences[start : start + BATCH_SIZE]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch], device=device)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=device)
        labels = torch.tensor(
            [[t if m else -100 for t, m in zip(i, mask)] + [-100] * (width - len(i)) for i, mask in batch],
            device=device,
        )
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="none"
        ).view(len(batch), -1)
        out += [(float(row.sum()), int(n)) for row, n in zip(loss, (labels[:, 1:] != -100).sum(dim=1))]
        say(start + len(batch), len(sequences))
    return out


def mean_loss(losses: list[tuple[float, int]]) -> tuple[float, int]:
    """(loss per scored token, tokens) over the rows."""
    tokens = sum(n for _, n in losses)
    if tokens == 0:
        raise AfterError("the evaluation data leaves no tokens to score (empty completions?)")
    return sum(loss for loss, _ in losses) / tokens, tokens


def chosen_preferred(model, tokenizer, pairs: list[dict], chosen: list[tuple[float, int]], max_length, say, cancel):
    """The share of preference pairs where the model gives the chosen answer the higher log-probability (summed over
    its tokens, as DPO's rewards are): 0.5 is no preference."""
    rejected_rows = [{**p, "completion": p["rejected"]} for p in pairs]
    rejected = completion_losses(model, tokenizer, rejected_rows, max_length, say, cancel)
    return sum(c < r for (c, _), (r, _) in zip(chosen, rejected)) / len(pairs)


def answers(model, tokenizer, pairs: list[tuple[object, str | None]], say, cancel) -> list[str]:
    """Greedy answers, batched with left padding, as long as the data's answer allows (else up to MAX_NEW_TOKENS)."""
    import torch

    device = next(model.parameters()).device
    out = []
    for start in range(0, len(pairs), BATCH_SIZE):
        _check(cancel)
        batch = pairs[start : start + BATCH_SIZE]
        prompts = [_ids(tokenizer, p, generation_prompt=isinstance(p, list)) for p, _ in batch]
        expected = [e for _, e in batch]
        if None in expected:
            new_tokens = MAX_NEW_TOKENS
        else:
            longest = max(len(tokenizer(e, add_special_tokens=False)["input_ids"]) for e in expected)
            new_tokens = min(longest + EXTRA_NEW_TOKENS, MAX_NEW_TOKENS)
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids,
                attention_mask=attention,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                max_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        out += tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
        say(start + len(batch), len(pairs))
    return out


def score(model, tokenizer, rows: list[dict], max_length: int, progress=None, cancel=None, label: str = "") -> dict:
    """The metrics of one model on the rows."""
    started = time.monotonic()
    say = (
        (lambda stage: lambda done, total: progress(f"{label}: {stage}", done, total))
        if progress
        else (lambda stage: lambda *a: None)
    )
    scored = [row for row in rows if has_answer(row)]
    losses = completion_losses(model, tokenizer, scored, max_length, say("loss"), cancel)
    loss, tokens = mean_loss(losses) if scored else (None, 0)
    result = {
        "loss": loss,
        "perplexity": None if loss is None else math.exp(min(loss, 700)),
        "tokens": tokens,
        "examples": len(rows),
        "preferred": None,
    }
    ranked = [(row, lost) for row, lost in zip(scored, losses) if row.get("rejected") is not None]
    if ranked:
        pairs, chosen = [row for row, _ in ranked], [lost for _, lost in ranked]
        result["preferred"] = chosen_preferred(model, tokenizer, pairs, chosen, max_length, say("pairs"), cancel)
    pairs = [qa for qa in map(question_and_answer, rows) if qa is not None]
    result.update(exact_match=None, contains_match=None, rouge_l=None, generated=0, answers=[])
    if pairs:
        got = answers(model, tokenizer, pairs, say("generating answers"), cancel)
        result["answers"] = [judged(p, e, a) for (p, e), a in zip(pairs, got)]  # saved beside eval.json, not in it
        result["generated"] = len(pairs)
        with_answer = [row for row in result["answers"] if row["expected"] is not None]
        if with_answer:
            result.update(
                exact_match=sum(row["exact_match"] for row in with_answer) / len(with_answer),
                contains_match=sum(row["contains_match"] for row in with_answer) / len(with_answer),
                rouge_l=sum(row["rouge_l"] for row in with_answer) / len(with_answer),
            )
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def judged(prompt: object, expected: str | None, answer: str) -> dict:
    """One answer as eval-answers/<model>.jsonl keeps it; its scores None when the data has no answer to the prompt."""
    if expected is None:
        return {"prompt": prompt, "expected": None, "answer": answer, **dict.fromkeys(SCORES)}
    scores = (exact_match(answer, expected), contains_match(answer, expected), round(rouge_l(answer, expected), 4))
    return {"prompt": prompt, "expected": expected, "answer": answer, **dict(zip(SCORES, scores, strict=True))}


def evaluate_run(
    run_dir: Path, job: dict, names: list[str], device: str, data_file=None, limit=None, progress=None, cancel=None
) -> dict:
    """{"data": source, "results": {name: metrics}} for the named weights ("base", "final", "checkpoint-N")."""
    from tunedeck.backend.after.model_load import load_base, load_tokenizer, loaded_as, with_adapter

    every: dict[str, Weights] = {w.name: w for w in list_weights(run_dir, job)}
    missing = [n for n in names if n not in every]
    if missing:
        raise AfterError(f"the run has no {missing[0]} to evaluate (it has: {', '.join(every)})")
    rows, source = eval_rows(run_dir, job, data_file, limit)
    max_length = int((job.get("dataset") or {}).get("max_seq_length") or 2048)
    adapters = [every[n] for n in sorted(set(names), key=order_key) if not every[n].is_base]
    tokenizer = load_tokenizer(run_dir, job, adapters[-1] if adapters else every["base"])
    if progress:
        progress(f"loading the base model on {device}", 0, 1)
    model = load_base(run_dir, job, device)
    results = {}
    if "base" in names:
        results["base"] = score(model, tokenizer, rows, max_length, progress, cancel, label="base")
    for index, weights in enumerate(adapters):
        _check(cancel)
        model = with_adapter(model, run_dir, job, weights, progress, adapter_name=f"a{index}")
        if index:
            model.delete_adapter(f"a{index - 1}")  # one adapter in memory at a time
        results[weights.name] = score(model, tokenizer, rows, max_length, progress, cancel, label=weights.name)
        results[weights.name]["step"] = weights.step
    stamp = time.time()
    for result in results.values():
        result.update(data=source, device=device, evaluated_at=stamp, loaded_as=loaded_as(model))
    return {"data": source, "results": results}
