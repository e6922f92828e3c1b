"""Rows cut at max_seq_length: how many, what of them is lost, and the length that keeps 95% of them whole.

The dataset preview (backend/data/preview.py) measures each row's tokens and the tokens before its answer, the part
the loss is computed on; `preview.for_job` reads that measurement for any max_seq_length, batch and packing, and
this module turns it into a warning with a fix. Both are pure Python: the panel re-reads one measurement at every
edit, and measures again only when what it depends on changes (`measure_key`).

What TRL 1.16 does with a row longer than max_length (SFTConfig and DPOConfig keep its start, truncation_mode
"keep_start"): without packing, SFTTrainer drops the rows left without a token to learn from (the answer cut
away whole, where only the answer carries loss), and DPOTrainer the pairs whose prompt alone fills max_length.
With packing (the recipe leaves packing_strategy at TRL's "bfd"), pack_dataset cuts each row at max_length
before it fills blocks (on_seq_length_overflow="truncate"): packing saves no row, and a row with its answer cut
away is packed all the same, with nothing to learn from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from tunedeck.backend.data.preview import CHARS_PER_TOKEN, for_job, measured_seq_len
from tunedeck.backend.recipe import looks_local
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem, warning

CUT_SHARE = 0.05  # more rows cut than this is a warning: the 95th percentile no longer fits
ROUND_TO = 8  # the suggested length: a multiple of 8, as tensor cores and TRL's pad_to_multiple_of like it
LONGEST = 1_048_576  # dataset.max_seq_length's and grpo.max_prompt_length's upper bound

# The answer of each format, which a cut at the end reaches first, and what the loss does with it.
ANSWERS = {
    "prompt-completion": "the completion, the only part the loss is computed on,",
    "alpaca": "the output, the only part the loss is computed on,",
    "messages": "the assistant's turn, the answer the model learns to give,",
    "preference": "the chosen and rejected answers, which the preference loss compares,",
    "unpaired-preference": "the answer, which KTO scores,",
}
ASSISTANT_ONLY = "the assistant's turn, the only part the loss is computed on,"  # dataset.assistant_only_loss
COMPLETION_ONLY = ("prompt-completion", "alpaca")  # TRL's completion_only_loss is on for prompt-completion rows


def measure_key(spec: JobSpec) -> str:
    """What a measurement depends on: the data (source, split, format, columns; a local file's size and time) and
    the model's tokenizer and chat template (its path or hub id, revision; a local folder's tokenizer files). Not
    max_seq_length, packing, the batch or anything else: for_job re-reads a measurement for those."""
    dataset = spec.dataset.model_dump(
        mode="json", exclude={"max_seq_length", "packing", "assistant_only_loss", "mix", "eval_split"}
    )
    model = spec.model
    return json.dumps(
        [
            dataset,
            _stamp(spec.dataset.path),
            model.name_or_path,
            model.revision,
            model.trust_remote_code,
            _stamp(model.name_or_path, ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")),
        ],
        sort_keys=True,
    )


def measured_locally(spec: JobSpec) -> bool:
    """Whether the data and the tokenizer are local files, so measure_key changes whenever they do: a measurement
    under that key holds for good (the panel keeps it on disk across restarts). A hub id's files may change
    upstream without its key changing."""
    model = spec.model.name_or_path
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    return _stamp(spec.dataset.path) is not None and bool(_stamp(model, tokenizer_files))


def _stamp(source: str, inside: tuple[str, ...] | None = None) -> list | None:
    """A local file's or folder's size and modification time (and of the named files in a folder, or of its
    first files): a changed file is a new measurement. None for a hub id."""
    path = Path(source).expanduser()
    try:
        if not path.exists():
            return None
        if path.is_file():
            return [path.stat().st_size, path.stat().st_mtime_ns]
        names = inside or sorted(os.listdir(path))[:64]
        return [[name, (path / name).stat().st_mtime_ns] for name in names if (path / name).exists()]
    except OSError:
        return None


def why_not_measured(spec: JobSpec) -> str | None:
    """Why the page does not measure the dataset by itself (it would only fail): a local path that is not there,
    or a hub dataset not in the local Hugging Face cache (the preview never downloads). None: measure it."""
    source = spec.dataset.path
    path = Path(source).expanduser()
    if path.exists():
        return None
    if looks_local(source) or path.suffix.lower() in (".json", ".jsonl", ".csv", ".parquet"):
        return f"{source} does not exist here: the preview measures it once it does."
    if not _hub_cached(source):
        return (
            f"{source} is not in this machine's Hugging Face cache, and the preview never downloads: "
            f"`hf download --repo-type dataset {source}` (or one run) puts it there; then press Measure."
        )
    return None


def _hub_cached(repo: str) -> bool:
    """Whether huggingface_hub or datasets holds the dataset locally, found without importing either."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    arrow = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    return (hub / f"datasets--{repo.replace('/', '--')}").is_dir() or (arrow / repo.replace("/", "___")).is_dir()


def measured_facts(spec: JobSpec, measured: Mapping[str, dict] | None) -> tuple[int | None, list[Problem]]:
    """(the sequence length the memory estimate should use, the truncation warning) from the preview's measurement
    of this job's data ({measure_key: measurement}); (None, []) while there is none."""
    found = measured.get(measure_key(spec)) if measured else None
    if not found or "error" in found:
        return None, []
    result = for_job(found, spec)
    return measured_seq_len(result["stats"], result["packing"]), truncation_problems(spec, result)


def measured_lengths(spec: JobSpec, measured: Mapping[str, dict] | None) -> dict | None:
    """The preview's length statistics of this job's data, read for its max_seq_length, batch and packing (what the
    speed estimate counts padding and packed sequences from: backend/estimate/speed_data.py), or None while there are none."""
    found = measured.get(measure_key(spec)) if measured else None
    if not found or "error" in found:
        return None
    return for_job(found, spec)["stats"]


def suggested_length(p95: int) -> int:
    """The length that keeps the 95th percentile whole, rounded up to a multiple of ROUND_TO."""
    return min(LONGEST, math.ceil(p95 / ROUND_TO) * ROUND_TO)


def truncation_problems(spec: JobSpec, result: dict) -> list[Problem]:
    """A warning when more than CUT_SHARE of the measured rows are cut, saying what of them is lost and the
    length that keeps 95% whole, with that length as its fix; `result` is preview.for_job's."""
    s = result["stats"]
    if not s.get("rows") or s["truncated"] <= CUT_SHARE * s["rows"]:
        return []
    field = s.get("limit_field") or "dataset.max_seq_length"
    longer = suggested_length(s["p95"])
    fix = {field: longer} if longer > s["max_seq_length"] else None
    estimated = (
        f" (token counts estimated at {CHARS_PER_TOKEN} characters per token: the model's tokenizer is not on this "
        "machine)"
        if result["counted"] != "tokens"
        else ""
    )
    share = f"{s['truncated']:,} of {s['rows']:,}"
    if field == "grpo.max_prompt_length":  # GRPO leaves a longer prompt out (train.prompts_within)
        said = (
            f"{share} prompts measured ({s['truncated'] / s['rows']:.0%}) are longer than {field} ({s['max_seq_length']:,} "
            f"tokens) and are left out of training. Set it to {longer:,} to keep 95% of them (p95: {s['p95']:,} tokens)"
        )
        return [warning(field, said + estimated + ".", fix)]
    said = (
        f"{share} rows measured ({s['truncated'] / s['rows']:.0%}) are longer than max_seq_length "
        f"({s['max_seq_length']:,} tokens) and are cut at the end: {_lost(spec, s, result['packing'])}."
    )
    if result["packing"]:
        said += " Packing does not save them: each row is cut at max_seq_length before it is packed."
    said += f" Set it to {longer:,} to keep 95% of rows whole (p95: {s['p95']:,} tokens){estimated}."
    return [warning(field, said, fix)]


def _lost(spec: JobSpec, s: dict, packing: bool) -> str:
    """What the cut takes: the answer (whole or in part) where the rows have one, else the text's end."""
    fmt = spec.dataset.format
    whole, part = s.get("answer_lost", 0), s.get("answer_cut", 0)
    if fmt not in ANSWERS or not whole + part:
        return "the end of each is never trained on"
    only = fmt in COMPLETION_ONLY or (fmt == "messages" and spec.dataset.assistant_only_loss)
    answer = ASSISTANT_ONLY if fmt == "messages" and only else ANSWERS[fmt]
    if spec.objective == "sft" and only:
        fate = " (packed with nothing to learn from)" if packing else " (TRL leaves them out of training)"
    elif spec.objective == "sft" and fmt == "messages":
        fate = " (they train on the question alone)"
    elif spec.objective == "dpo":
        fate = " (DPO leaves those pairs out of training)"
    else:
        fate = ""
    cuts = [f"cut away whole in {whole:,} rows{fate}"] * bool(whole) + [f"cut short in {part:,}"] * bool(part)
    return f"{answer} is " + " and ".join(cuts)
