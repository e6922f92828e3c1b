"""The training and held-out rows: a local file or a hub dataset, the dataset.mix sources after them, GRPO's prompts
within their limit.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from .formats import in_job_format, to_trl_format
from .job import JobError
from .source_loss import SOURCE_COLUMN, tracks_sources, with_source_column

DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_split(dataset_cfg: dict, split: str):
    """One split of a local JSON/JSONL/CSV/Parquet file or folder, or of a hub dataset."""
    from datasets import load_dataset

    source = str(dataset_cfg["path"])
    path = Path(source).expanduser()
    if path.is_file():
        builder = DATA_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise JobError(
                f"dataset.path: {path} is not a .json, .jsonl, .csv or .parquet file; convert it or point to a folder"
            )
        return load_dataset(builder, data_files=str(path), split=split)
    if path.is_dir():
        return load_dataset(str(path), split=split)
    if looks_local(source) or path.suffix.lower() in DATA_FILE_BUILDERS:
        raise JobError(f"dataset.path: {missing_path(source, Path.cwd())}")
    return load_dataset(source, dataset_cfg.get("name"), split=split)


def load_datasets(job: dict, args, tokenizer):
    """(training rows, evaluation rows or None, {source: training rows it gave}) as TRL's trainer takes them."""
    dataset_cfg = job.get("dataset") or {}
    if dataset_cfg.get("format") == "messages" and not tokenizer.chat_template:
        raise JobError(
            f"dataset.format: messages needs a chat template, and the tokenizer of {job['model']['name_or_path']} "
            "has none; use a chat model or the prompt-completion format"
        )
    text_column = getattr(args, "dataset_text_field", "text")  # DPOConfig has none: preference data has no text column
    train = to_trl_format(load_split(dataset_cfg, dataset_cfg.get("split") or "train"), dataset_cfg, text_column)
    train, rows = mixed_in(train, dataset_cfg, text_column, int(getattr(args, "seed", 42)))
    evaluation = None
    if dataset_cfg.get("eval_split"):
        evaluation = to_trl_format(load_split(dataset_cfg, dataset_cfg["eval_split"]), dataset_cfg, text_column)
    tagged = tracks_sources(job, rows)  # each row says its source, for the loss of each (source_loss.py)
    if tagged:
        train = train.add_column(SOURCE_COLUMN, [i for i, count in enumerate(rows.values()) for _ in range(count)])
    if evaluation is not None and len(rows) > 1:
        evaluation = mixed_eval(evaluation, dataset_cfg, text_column, tagged)
    if job.get("objective") == "grpo":
        limit = int((job.get("grpo") or {}).get("max_prompt_length") or 512)
        train = prompts_within(train, tokenizer, limit, "dataset.split")
        evaluation = evaluation and prompts_within(evaluation, tokenizer, limit, "dataset.eval_split")
    return train, evaluation, rows


# SOURCE[@CONFIG][:SPLIT][#ROWS], as backend/spec/mix.py reads it (tests/spine/test_dataset_mix.py checks the copy).
MIX_ENTRY = re.compile(r"(?P<path>[^@#]+?)(?:@(?P<config>[^:#]+))?(?::(?P<split>[^#]+))?(?:#(?P<rows>[0-9]+))?")


def mix_sources(dataset_cfg: dict) -> list[tuple[str, dict, str, int | None]]:
    """(entry, the dataset config that reads it, split, rows or None) of each dataset.mix entry."""
    sources = []
    for entry in dataset_cfg.get("mix") or []:
        match = MIX_ENTRY.fullmatch(str(entry).strip())
        if match is None:
            raise JobError(f"dataset.mix: {entry!r} is not SOURCE[@CONFIG][:SPLIT][#ROWS]")
        config = {**dataset_cfg, "path": match["path"].strip(), "name": match["config"]}
        rows = int(match["rows"]) if match["rows"] else None
        sources.append((str(entry).strip(), config, (match["split"] or "train").strip(), rows))
    return sources


def mixed_in(train, dataset_cfg: dict, text_column: str, seed: int):
    """(The training rows with each dataset.mix source's rows after them, {source: its rows}): the trainer shuffles
    them all. Says how many rows each source gave, so the log shows what the run trained on."""
    from datasets import concatenate_datasets

    rows_of = {"dataset.path": len(train)}
    sources = mix_sources(dataset_cfg)
    if not sources:
        return train, rows_of
    parts, counts = [train], [f"{len(train):,} from dataset.path"]
    for entry, config, split, rows in sources:
        try:
            part = in_job_format(load_split(config, split), config, text_column)
        except JobError as exc:
            raise JobError(f"dataset.mix {entry!r}: {str(exc).split(': ', 1)[-1]}") from exc
        if not len(part):
            raise JobError(f"dataset.mix {entry!r}: the split {split!r} has no rows; fix the entry or leave it out")
        had = len(part)
        if rows is not None:
            part = resampled(part, rows, seed)
        try:
            parts.append(part.cast(train.features) if part.features != train.features else part)
        except (ValueError, TypeError) as exc:
            raise JobError(
                f"dataset.mix {entry!r}: its rows do not have the main dataset's columns and types ({exc}); "
                "mix in data of the same dataset.format and column types, or of a format named by its columns"
            ) from exc
        counts.append(f"{len(part):,} from {entry}" + (f" (of {had:,})" if rows is not None and rows != had else ""))
        rows_of[entry] = len(part)
    print(f"dataset: {sum(len(p) for p in parts):,} training rows: " + ", ".join(counts), flush=True)
    return concatenate_datasets(parts), rows_of


def trains_on(trained: str, held_out: str) -> bool:
    """Whether a mix source trained on split `trained` holds split `held_out`'s rows: all of a split holds every
    slice of it ("train" holds "train[90%:]"). Slices of one split are taken as the user chose them."""
    return "[" not in trained and held_out.split("[")[0].strip() == trained.strip()


def mixed_eval(evaluation, dataset_cfg: dict, text_column: str, tagged: bool):
    """The held-out rows of dataset.eval_split, then each dataset.mix source's rows of the same split (tagged: every
    row with its source's index); a source without that split is evaluated on none (the log says so). Evaluate
    after training reads the same rows (backend/after/scoring.py: with_mix_rows)."""
    from datasets import concatenate_datasets

    split = dataset_cfg["eval_split"]
    tag = with_source_column if tagged else (lambda part, _: part)
    parts = [tag(evaluation, 0)]
    for index, (entry, config, trained, _) in enumerate(mix_sources(dataset_cfg), start=1):
        if trains_on(trained, split):
            print(
                f"dataset.mix {entry!r}: its held-out loss is not logged: it trains on all of split {trained!r}, "
                f"which holds {split!r}; give the entry a split without those rows, e.g. :{trained}[:90%]",
                flush=True,
            )
            continue
        try:
            part = in_job_format(load_split(config, split), config, text_column)
            part = part.cast(evaluation.features) if part.features != evaluation.features else part
        except (JobError, ValueError, TypeError) as exc:  # datasets: "Unknown split", a slice out of range
            print(
                f"dataset.mix {entry!r}: no evaluation rows of split {split!r} ({exc}); its eval loss is not logged",
                flush=True,
            )
            continue
        parts.append(tag(part, index))
    return concatenate_datasets(parts)


def resampled(dataset, rows: int, seed: int):
    """`rows` rows of the dataset: a seeded sample of fewer, or whole copies of it and a sample for the rest."""
    copies, rest = divmod(rows, len(dataset))
    indices = list(range(len(dataset))) * copies + random.Random(seed).sample(range(len(dataset)), rest)
    return dataset.select(indices)


def prompts_within(dataset, tokenizer, limit: int, split_field: str):
    """GRPO's rows whose prompt fits grpo.max_prompt_length tokens (GRPOConfig has no max_length: TRL 1.16 would
    write answers after a prompt of any length, and the memory estimate counts on the limit); says how many left."""

    def fits(row) -> bool:
        prompt = row["prompt"]
        if isinstance(prompt, list):  # a chat: as the model sees it, with the generation prompt
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) else ids
        else:
            ids = tokenizer(prompt)["input_ids"]
        return len(ids) <= limit

    kept = dataset.filter(fits)
    dropped = len(dataset) - len(kept)
    if not len(kept):
        raise JobError(
            f"grpo.max_prompt_length: every prompt of {split_field} is longer than {limit} tokens; raise it to the "
            "prompts' length (tunedeck preview shows them)"
        )
    if dropped:
        print(
            f"grpo: {dropped} of {len(dataset)} prompts are longer than grpo.max_prompt_length ({limit} tokens) "
            "and are left out; raise it to keep them",
            flush=True,
        )
    return kept


def looks_local(name: str) -> bool:
    """A path rather than a hub id (hub ids are "name" or "org/name")."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def _where(source: str, base: Path) -> str:
    return "" if Path(source).expanduser().is_absolute() else f" (a relative path is taken from the run folder, {base})"


def missing_path(source: str, base: Path) -> str:
    return f"{source} does not exist{_where(source, base)}; fix the path"
