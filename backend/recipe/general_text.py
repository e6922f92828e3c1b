"""The general-text check while training: at each evaluation, the loss on a sample of general prose beside the
held-out rows' (dataset.general_text), the forgetting PEFT measures as the loss on a general-text slice before and
after fine-tuning, here seen as it happens.

The sample: "built-in" (the 6 KB of everyday prose tunedeck ships, which the bundle carries as general-text.txt) or
a plain-text file. Its text is tokenized whole and cut into blocks of dataset.max_seq_length tokens, each after the
BOS; the trainer's own evaluation loop scores them (its sampler, collator and gathering across ranks: what every
strategy already does for the held-out rows), every token of a block a label, and the mean loss joins the
evaluation's log record as eval_general_text_loss. The job evaluates once before the first step too (eval_on_start:
backend/render/training_args.py): the model as it started, which later evaluations are compared with. SFT only
(backend/spec/applies.py): the preference and GRPO trainers score rows of their own shape.

The page's forgetting check after training (backend/after/general_text.py) cuts the same sample the same way.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN = "built-in"  # dataset.general_text's value for the sample tunedeck ships
FILE = "general-text.txt"  # the built-in sample's name in a bundle (and so in a run folder)
MAX_TOKENS = 20_000  # of a sample: enough to see a rise, few enough to score in seconds at each evaluation
METRIC = "eval_general_text_loss"  # its key in an evaluation's log record
RISE_FLAGGED = 0.05  # a loss more than 5% above the one it is compared with: some general language forgotten


def sample_path(job: dict, base: Path) -> Path | None:
    """The sample's file, taken from the run folder `base` where relative (the built-in one is there), or None when
    the job measures none: no sample, or a job the check does not apply to (its spec warned of it as ignored)."""
    dataset = job.get("dataset") or {}
    source = dataset.get("general_text")
    applies = (
        (job.get("objective") or "sft") == "sft"
        and bool(dataset.get("eval_split"))
        and ((job.get("strategy") or {}).get("sequence_parallel") or 1) == 1
    )
    if not source or not applies:
        return None
    return Path(base) / (FILE if source == BUILTIN else Path(str(source)).expanduser())


def sample_problem(job: dict, base: Path) -> str | None:
    """Why the sample cannot be read as general text, before any library loads; None when it can (or there is none)."""
    path = sample_path(job, base)
    if path is None or job["dataset"]["general_text"] == BUILTIN:  # the bundle carries the built-in one
        return None
    fix = "give a plain-text (UTF-8) file of general prose, or built-in for the sample tunedeck ships"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} does not exist: {fix}"
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        return f"{path} cannot be read ({why}): {fix}"
    return None if text.strip() else f"{path} holds no text: {fix}"


def text_blocks(tokenizer, text: str, block: int) -> list[list[int]]:
    """The text's token ids in blocks of `block` (each after the BOS, where the tokenizer has one), up to MAX_TOKENS."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:MAX_TOKENS]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    step = max(block - len(bos), 2)
    blocks = [bos + ids[i : i + step] for i in range(0, len(ids), step)]
    return [b for b in blocks if len(b) > 1]  # a block's first token is not predicted


def general_text_set(job: dict, tokenizer, base: Path):
    """The sample as a tokenized dataset (input_ids only: TRL's collator makes every token a label), or None."""
    path = sample_path(job, base)
    if path is None:
        return None
    from datasets import Dataset

    block = int((job.get("dataset") or {}).get("max_seq_length") or 2048)
    return Dataset.from_dict({"input_ids": text_blocks(tokenizer, path.read_text(encoding="utf-8"), block)})


def with_general_text(base, sample):
    """The trainer class, scoring `sample` (general_text_set) at each evaluation and logging its loss with it."""

    class GeneralTextTrainer(base):
        _measured: dict | None = None

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            if eval_dataset is None:  # the held-out rows' evaluation, at an evaluation step
                # TRL averages the metrics its loss computes (token accuracy, entropy) over every batch scored
                # since the last log: the sample's batches must not count among the held-out rows'.
                kept = {key: list(values) for key, values in self._metrics["eval"].items()}
                loop = self.evaluation_loop(
                    self.get_eval_dataloader(sample),
                    description="general text",
                    prediction_loss_only=True,
                    metric_key_prefix="eval_general_text",
                )
                self._metrics["eval"].clear()
                self._metrics["eval"].update(kept)
                self._measured = {METRIC: loop.metrics[METRIC]}
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

        def log(self, logs, *args, **kwargs):
            if self._measured and "eval_loss" in logs:  # the held-out rows' evaluation: the sample's loss joins it
                logs = {**logs, **self._measured}
                self._measured = None
            return super().log(logs, *args, **kwargs)

    return GeneralTextTrainer
