"""What an evaluation scores, shared by the worker's evaluation (evaluate.py), the answers table
(eval_answers.py), eval.json (eval_results.py) and the Try box's examples (examples.py); no torch.

The rows: which data (eval_data.py) read in TRL's columns, and what a row asks and answers (a prompt
without the data's answer is answered, not scored). An answer against the data's: exact match (as
GRPO's exact_answer reward), contains match, ROUGE-L, and one answer as eval-answers/<model>.jsonl keeps
it. The models' order in every table: base, checkpoints by step, final.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

from tunedeck.backend import recipe
from tunedeck.backend.after.eval_data import eval_source, local
from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.spec import JobSpec

SOURCE_KEY = "data_source"  # a row's dataset.mix source ("dataset.path" for the job's own), when the run mixed data
SCORES = ("exact_match", "contains_match", "rouge_l")  # of each answer; null where the data has none
# Where a row's answers are: a preference pair's is its chosen one (unpaired ones: the answers labelled good).
ANSWER_FIELDS = {
    "prompt-completion": ("completion_field",),
    "alpaca": ("output_field",),
    "preference": ("chosen_field", "rejected_field"),
}


def eval_rows(
    run_dir: Path, job: JobSpec, data_file: str | None = None, limit: int | None = None
) -> tuple[list[dict], str]:
    """(rows in TRL's columns: prompt/completion, text or messages; where they came from). Which data:
    backend/after/eval_data.py (NoEvalData when the run has none)."""
    dataset_cfg, split, source = eval_source(run_dir, job, data_file)
    rows = _read_rows(dataset_cfg, split, source, limit, answers_optional=True)
    if data_file is None and job.dataset.eval_split and job.dataset.mix:  # each source's held-out rows, as trained
        return with_mix_rows(run_dir, dataset_cfg, split, rows, source, limit)
    return rows, source


def with_mix_rows(run_dir: Path, dataset_cfg: dict, split: str, rows: list[dict], source: str, limit: int | None):
    """(The rows of dataset.eval_split, then each dataset.mix source's rows of the same split, as the run evaluated
    them in training (backend/recipe/data.py: mixed_eval), each row with its source under SOURCE_KEY (up to `limit`
    rows of each source); where they came from). A source without that split adds none."""
    rows = [{**row, SOURCE_KEY: "dataset.path"} for row in rows]
    mixed = []
    for entry, config, trained, _ in recipe.mix_sources(dataset_cfg):
        if recipe.trains_on(trained, split):  # its held-out rows are training rows: not evaluated in training either
            continue
        config["path"] = str(local(run_dir, config["path"]))
        try:
            part = _read_rows(config, split, entry, limit, answers_optional=True, convert=recipe.in_job_format)
        except AfterError:  # no such split in this source: it was not evaluated in training either
            continue
        rows += [{**row, SOURCE_KEY: entry} for row in part]
        mixed.append(entry)
    return rows, source + "".join(f" + {entry} [{split}]" for entry in mixed)


def training_rows(run_dir: Path, job: JobSpec, limit: int | None = None) -> tuple[list[dict], str]:
    """(the first rows of the run's training split in TRL's columns; where they came from)."""
    dataset_cfg = job.dataset.model_dump(mode="json")  # what the recipe's loaders read
    dataset_cfg["path"] = str(local(run_dir, job.dataset.path))
    split = job.dataset.split or "train"
    return _read_rows(dataset_cfg, split, dataset_cfg["path"], limit, "training data"), dataset_cfg["path"]


def _read_rows(
    dataset_cfg: dict,
    split: str,
    source: str,
    limit: int | None,
    what: str = "evaluation data",
    answers_optional: bool = False,
    convert=recipe.to_trl_format,
) -> list[dict]:
    """The rows in TRL's columns; with `answers_optional`, a file of prompts alone gives rows whose completion is None."""
    try:
        dataset = recipe.load_split(dataset_cfg, split)
        answer_columns = _missing_answer_columns(dataset, dataset_cfg) if answers_optional else []
        for answer_column in answer_columns:
            dataset = dataset.add_column(answer_column, [""] * len(dataset))
        dataset = convert(dataset, dataset_cfg, "text")  # a dataset.mix source's: in_job_format, converted
        if "label" in dataset.column_names:  # answers labelled good or bad
            dataset = dataset.filter(lambda row: row["label"]).remove_columns("label")
    except recipe.JobError as exc:
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
    answers = [recipe.column(dataset_cfg, field) for field in ANSWER_FIELDS[fmt]]
    present = dataset.column_names
    if recipe.column(dataset_cfg, prompt_field) not in present or any(a in present for a in answers):
        return []
    return answers


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


def exact_match(answer: str, expected: str) -> bool:
    """The same final answer (after the last '####', inside the last \\boxed{}, or all of it; numbers as numbers),
    as GRPO's exact_answer reward scores it: "so 7 #### 7" answers "7"."""
    return recipe.exact_answer([answer], answer=[expected]) == [1.0]


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


def judged(prompt: object, expected: str | None, answer: str) -> dict:
    """One answer as eval-answers/<model>.jsonl keeps it; its scores None when the data has no answer to the prompt."""
    if expected is None:
        return {"prompt": prompt, "expected": None, "answer": answer, **dict.fromkeys(SCORES)}
    scores = (exact_match(answer, expected), contains_match(answer, expected), round(rouge_l(answer, expected), 4))
    return {"prompt": prompt, "expected": expected, "answer": answer, **dict(zip(SCORES, scores, strict=True))}


def by_source(rows: list[dict], scored: list[dict], losses: list, answered: list[tuple[dict, dict]]) -> dict:
    """{source: its loss, perplexity, tokens, examples and mean answer scores} of rows that carry their source
    (SOURCE_KEY); `losses` are the (summed loss, tokens) of the `scored` rows, `answered` (row, judged answer)."""
    out = {}
    for name in dict.fromkeys(row.get(SOURCE_KEY) for row in rows if SOURCE_KEY in row):
        lost = [loss for row, loss in zip(scored, losses) if row.get(SOURCE_KEY) == name]
        tokens = sum(n for _, n in lost)
        loss = sum(total for total, _ in lost) / tokens if tokens else None
        said = [answer for row, answer in answered if row.get(SOURCE_KEY) == name and answer["expected"] is not None]
        out[name] = {
            "loss": loss,
            "perplexity": None if loss is None else math.exp(min(loss, 700)),
            "tokens": tokens,
            "examples": sum(row.get(SOURCE_KEY) == name for row in rows),
            **{key: sum(a[key] for a in said) / len(said) if said else None for key in SCORES},
        }
    return out


def order_key(name: str) -> tuple:
    """base first, then checkpoints by step, then final."""
    if name == "base":
        return (0, 0)
    if name.startswith("checkpoint-") and name[len("checkpoint-") :].isdigit():
        return (1, int(name[len("checkpoint-") :]))
    return (2, 0)
