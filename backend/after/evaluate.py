"""Evaluate a run: loss and perplexity on held-out data, and exact/contains match and ROUGE-L of generated answers.

Sequences are tokenized as TRL's SFTTrainer did in training (its tokenize_fn in trl/trainer/sft_trainer.py): an EOS
appended to plain text and completions, the loss on the completion only for prompt-completion data
(completion_only_loss), on every token for text and messages. Loss: the mean over scored tokens; perplexity: exp(loss).

The data (backend/after/eval_data.py): a chosen file (in the run's dataset format), else the job's dataset.eval_split,
else the held-out file beside the training file. The base is loaded once; each adapter is put on it in turn.
Imports torch inside its functions: runs in the worker process. The rows it reads and how an answer is scored
against the data's: backend/after/scoring.py (no torch).

Prompts without answers (a file without the completion or output column, a row without its value, a conversation
that ends with the user's turn) are answered, not scored; GRPO's prompts (prompt-only) by their answer column.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tunedeck.backend.after.benchmarks import Benchmarks, harness_scores, load_tasks, task_manager
from tunedeck.backend.after.general_text import mean_text_loss, read_general_text
from tunedeck.backend.after.scoring import by_source, eval_rows, has_answer, judged, order_key, question_and_answer
from tunedeck.backend.recipe.general_text import text_blocks
from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.runs.checkpoints import AfterError, Weights, list_weights
from tunedeck.backend.spec import JobSpec

BATCH_SIZE = 8
EXTRA_NEW_TOKENS = 8  # answers may run this far past the longest expected one before they are cut
MAX_NEW_TOKENS = 256  # also how far a prompt without an answer in the data may be answered


class Cancelled(Exception):
    """The caller asked to stop."""


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


def _check(cancel) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def completion_losses(model, tokenizer, rows: list[dict], max_length: int, say, cancel) -> list[tuple[float, int]]:
    """(summed loss, tokens) of each row's scored tokens: its completion (or the whole text)."""
    sequences = [scored_sequence(tokenizer, row, max_length) for row in rows]
    return sequence_losses(model, tokenizer, sequences, say, cancel)


def sequence_losses(model, tokenizer, sequences: list[tuple[list[int], list[int]]], say, cancel):
    """(summed loss, tokens) of each (input_ids, loss mask): the loss of each masked token given those before it."""
    import torch

    device = next(model.parameters()).device
    out: list[tuple[float, int]] = []
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


def chosen_preferred(
    model, tokenizer, pairs: list[dict], chosen: list[tuple[float, int]], max_length, say, cancel, per_token=False
):
    """The share of preference pairs where the model gives the chosen answer the higher log-probability, summed over
    its tokens as DPO's rewards are, or per token as ORPO's and SimPO's (per_token: the objective's answer_score,
    backend/recipe/objectives_table.py): 0.5 is no preference."""
    rejected_rows = [{**p, "completion": p["rejected"]} for p in pairs]
    rejected = completion_losses(model, tokenizer, rejected_rows, max_length, say, cancel)
    if per_token:
        return sum(c / max(nc, 1) < r / max(nr, 1) for (c, nc), (r, nr) in zip(chosen, rejected)) / len(pairs)
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


def score(
    model, tokenizer, rows: list[dict], max_length: int, progress=None, cancel=None, label: str = "", per_token=False
) -> dict:
    """The metrics of one model on the rows (per_token: pairs compared by mean log-probability, see chosen_preferred)."""
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
        result["preferred"] = chosen_preferred(
            model, tokenizer, pairs, chosen, max_length, say("pairs"), cancel, per_token
        )
    asked = [(row, qa) for row in rows if (qa := question_and_answer(row)) is not None]
    pairs = [qa for _, qa in asked]
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
    sources = by_source(rows, scored, losses, list(zip([row for row, _ in asked], result["answers"])))
    if sources:  # rows of a dataset.mix run's sources: the same measures of each
        result["by_source"] = sources
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def evaluate_run(
    run_dir: Path,
    job: JobSpec,
    names: list[str],
    device: str,
    data_file=None,
    limit=None,
    progress=None,
    cancel=None,
    benchmarks: Benchmarks | None = None,
    general_text: str | None = None,
) -> dict:
    """{"data": source, "results": {name: metrics}} for the named weights ("base", "final", "checkpoint-N");
    with `benchmarks`, each model's lm-evaluation-harness scores too (backend/after/benchmarks.py), and with
    `general_text` (a file, or "built-in") its loss on general text, the forgetting check (general_text.py)."""
    from tunedeck.backend.after.model_load import load_base, load_tokenizer, loaded_as, with_adapter

    every: dict[str, Weights] = {w.name: w for w in list_weights(run_dir, job)}
    missing = [n for n in names if n not in every]
    if missing:
        raise AfterError(f"the run has no {missing[0]} to evaluate (it has: {', '.join(every)})")
    rows, source = eval_rows(run_dir, job, data_file, limit)
    checks = Checks(job, benchmarks, general_text, progress, cancel)  # bad names or files: said before a model loads
    max_length = job.dataset.max_seq_length
    per_token = OBJECTIVES[job.objective].answer_score == "mean"  # as the objective's trainer weighs an answer
    adapters = [every[n] for n in sorted(set(names), key=order_key) if not every[n].is_base]
    tokenizer = load_tokenizer(run_dir, job, adapters[-1] if adapters else every["base"])
    if progress:
        progress(f"loading the base model on {device}", 0, 1)
    model = load_base(run_dir, job, device)
    results = {}
    if "base" in names:
        results["base"] = score(model, tokenizer, rows, max_length, progress, cancel, "base", per_token)
        results["base"].update(checks.run(model, tokenizer, "base"))
    for index, weights in enumerate(adapters):
        _check(cancel)
        model = with_adapter(model, run_dir, job, weights, progress, adapter_name=f"a{index}")
        if index:
            model.delete_adapter(f"a{index - 1}")  # one adapter in memory at a time
        results[weights.name] = score(model, tokenizer, rows, max_length, progress, cancel, weights.name, per_token)
        results[weights.name].update(checks.run(model, tokenizer, weights.name), step=weights.step)
    stamp = time.time()
    for result in results.values():
        result.update(data=source, device=device, evaluated_at=stamp, loaded_as=loaded_as(model))
    return {"data": source, "results": results}


class Checks:
    """What an evaluation measures beside the data's scores: benchmarks and the general-text loss, each checked
    (task names, the task data, the text file) when made, so a mistake is said before a model loads."""

    def __init__(self, job: JobSpec, benchmarks: Benchmarks | None, general_text: str | None, progress, cancel):
        self.benchmarks, self.progress, self.cancel = benchmarks, progress, cancel
        self.block = job.dataset.max_seq_length
        self.chat = job.dataset.format == "messages"  # a run that trained through its chat template is asked so
        self.manager = None
        if benchmarks:
            if progress:
                progress("finding the benchmark tasks", 0, 1)
            self.manager = task_manager(benchmarks)
            load_tasks(benchmarks, self.manager)
        self.text, self.source = read_general_text(general_text) if general_text else (None, None)

    def _say(self, stage: str):
        return (lambda done, total: self.progress(stage, done, total)) if self.progress else (lambda *a: None)

    def run(self, model, tokenizer, label: str) -> dict:
        """{"benchmarks": {task: ...}, "general_text": {loss, perplexity, tokens, source}} of one model."""
        out: dict = {}
        if self.benchmarks:
            say = self._say(f"{label}: benchmarks ({', '.join(self.benchmarks.tasks)})")
            out["benchmarks"] = harness_scores(
                model, tokenizer, self.benchmarks, self.manager, self.chat, say, lambda: _check(self.cancel)
            )
        if self.text is not None:
            say = self._say(f"{label}: general-text loss")
            blocks = [(ids, [1] * len(ids)) for ids in text_blocks(tokenizer, self.text, self.block)]
            losses = sequence_losses(model, tokenizer, blocks, say, self.cancel)
            out["general_text"] = {**mean_text_loss(losses), "source": self.source}
        return out
