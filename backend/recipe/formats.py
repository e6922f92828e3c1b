"""The dataset formats: what each reads from a row, and the rows turned into what TRL's trainers read."""

from __future__ import annotations

from .job import JobError
from .vocabulary import DATASET_FORMATS

ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"

ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def _require_columns(dataset, needed: dict[str, str]) -> None:
    """needed: spec field name -> column name."""
    missing = {field: col for field, col in needed.items() if col not in dataset.column_names}
    if missing:
        field, col = next(iter(missing.items()))
        raise JobError(
            f"dataset.{field}: column {col!r} is not in the dataset (columns: {', '.join(dataset.column_names)}); "
            f"set dataset.{field} to the right column or change dataset.format"
        )


def to_trl_format(dataset, dataset_cfg: dict, text_column: str):
    """Map the spec's formats onto what TRL reads: text, prompt/completion, messages or prompt/chosen/rejected."""
    fmt = dataset_cfg.get("format", "text")
    field = lambda name: column(dataset_cfg, name)  # noqa: E731
    if fmt == "text":
        col = field("text_field")
        _require_columns(dataset, {"text_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, text_column) if col != text_column else dataset
    if fmt == "prompt-completion":
        prompt, completion = field("prompt_field"), field("completion_field")
        _require_columns(dataset, {"prompt_field": prompt, "completion_field": completion})
        dataset = dataset.select_columns([prompt, completion])
        return dataset.rename_columns({c: n for c, n in ((prompt, "prompt"), (completion, "completion")) if c != n})
    if fmt == "messages":
        col = field("messages_field")
        _require_columns(dataset, {"messages_field": col})
        dataset = dataset.select_columns([col])
        return dataset.rename_column(col, "messages") if col != "messages" else dataset
    if fmt == "alpaca":
        instruction, given, output = (
            field("instruction_field"),
            field("input_field"),
            field("output_field"),
        )
        _require_columns(dataset, {"instruction_field": instruction, "output_field": output})
        has_input = given in dataset.column_names

        def convert(example):
            extra = (example[given] or "").strip() if has_input else ""
            template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
            return {
                "prompt": template.format(instruction=example[instruction].strip(), input=extra),
                "completion": str(example[output]),
            }

        return dataset.map(convert, remove_columns=dataset.column_names)
    if fmt in ("preference", "unpaired-preference"):
        names = {field: field.removesuffix("_field") for field in FORMAT_COLUMNS[fmt]}  # TRL's: prompt, chosen, ...
        columns = {name: field(name) for name in names}
        _require_columns(dataset, columns)
        dataset = dataset.select_columns(list(columns.values()))
        dataset = dataset.rename_columns({columns[name]: trl for name, trl in names.items() if columns[name] != trl})
        if fmt == "unpaired-preference" and dataset.features["label"].dtype != "bool":  # CSV: "true", 1, ...
            dataset = dataset.map(lambda row, i: {"label": _label_of_row(row["label"], i, columns)}, with_indices=True)
        return dataset
    if fmt == "prompt-only":  # GRPO: the rewards get every other column too (TRL passes them by name)
        prompt, answer = field("prompt_field"), field("answer_field")
        _require_columns(dataset, {"prompt_field": prompt})
        renames = {prompt: "prompt"}
        if answer in dataset.column_names and answer != "answer":
            if "answer" in dataset.column_names:
                dataset = dataset.remove_columns(["answer"])
            renames[answer] = "answer"
        return dataset.rename_columns({c: n for c, n in renames.items() if c != n})
    raise JobError(f"dataset.format: {fmt!r} is not one of {', '.join(FORMAT_COLUMNS)}")


# A mixed-in source in another SFT format joins the job's rows converted, its format named by its columns' usual
# names (as LLaMA-Factory and ms-swift read each dataset of a mix in its own format). What TRL reads of each:
TRL_LAYOUT = {
    "text": "text",
    "prompt-completion": "prompt-completion",
    "alpaca": "prompt-completion",
    "messages": "messages",
}

FORMAT_BY_COLUMNS = (("messages", {"messages"}), ("alpaca", {"instruction", "output"}),
                     ("prompt-completion", {"prompt", "completion"}), ("text", {"text"}))  # fmt: skip


def format_by_columns(columns) -> str | None:
    """The SFT format a source's column names say, by their usual names; None when they say none."""
    return next((fmt for fmt, needs in FORMAT_BY_COLUMNS if needs <= set(columns)), None)


def joins(source_format: str, job_format: str) -> bool:
    """Whether rows of `source_format` convert to `job_format`'s: the same layout for TRL, or a prompt and its
    completion made one chat (a user turn, then the assistant's) or one text."""
    have, want = TRL_LAYOUT.get(source_format), TRL_LAYOUT.get(job_format)
    return have is not None and want is not None and (have == want or have == "prompt-completion")


def cannot_join(columns, own: str, job_format: str) -> str:
    welcome = ", ".join(fmt for fmt in TRL_LAYOUT if joins(fmt, job_format))
    return (
        f"its columns ({', '.join(columns)}) are the {own} format's, and {own} rows cannot join a {job_format} job; "
        f"mix in rows of these formats: {welcome}"
    )


def in_job_format(dataset, dataset_cfg: dict, text_column: str):
    """A dataset.mix source's rows as TRL reads the job's: read with the job's format and columns; where those
    columns are missing, in the format its own columns name, converted (JobError when it names none that joins)."""
    job_format = dataset_cfg.get("format", "text")
    try:
        return to_trl_format(dataset, dataset_cfg, text_column)
    except JobError:
        own = format_by_columns(dataset.column_names)
        if own is None or own == job_format:
            raise
    if not joins(own, job_format):
        raise JobError(f"dataset.mix: {cannot_join(dataset.column_names, own, job_format)}")
    if own == "alpaca" and TRL_LAYOUT[job_format] == "messages":  # the instruction and its input as the user's turn
        return dataset.map(
            lambda row: _chat(
                f"{row['instruction']}\n\n{row['input']}" if row.get("input") else row["instruction"], row["output"]
            ),
            remove_columns=dataset.column_names,
        )
    rows = to_trl_format(dataset, {"format": own}, text_column)  # its own columns, by their usual names
    if TRL_LAYOUT[job_format] == "messages":
        return rows.map(lambda row: _chat(row["prompt"], row["completion"]), remove_columns=rows.column_names)
    if TRL_LAYOUT[job_format] == "text":
        return rows.map(
            lambda row: {text_column: _text(row["prompt"]) + _text(row["completion"])}, remove_columns=rows.column_names
        )
    return rows


def _chat(prompt, answer) -> dict:
    return {"messages": [{"role": "user", "content": _text(prompt)}, {"role": "assistant", "content": _text(answer)}]}


def _text(value) -> str:
    """A converted row's prompt or answer: text, not already a chat (a chat's prompt joins only a chat job as is)."""
    if not isinstance(value, str):
        raise JobError(
            f"dataset.mix: a prompt or answer holds {_kind_of(value)}, not text; convert the file to messages"
        )
    return value


# What each dataset.format reads: spec field -> (default column, what its values must be), from the format table.
FORMAT_COLUMNS = {name: {c.field: (c.default, c.kind) for c in fmt.columns} for name, fmt in DATASET_FORMATS.items()}

CHAT_EXAMPLE = '[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]'

KIND_NEEDS = {
    "text": 'a string, e.g. "The answer is 4."',
    "optional text": "a string or null",
    "text or chat": f"a string, or a list of messages such as {CHAT_EXAMPLE}",
    "chat": f"a list of messages, e.g. {CHAT_EXAMPLE}",
    "label": "true (a good answer) or false (a bad one), or 1/0",
}

LABEL_WORDS = {"true": True, "1": True, "false": False, "0": False}


def as_label(value) -> bool | None:
    """A good/bad label as a bool (JSON true/false, or 1/0 and their words as CSV reads them), None if it is none."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    return LABEL_WORDS.get(value.strip().lower()) if isinstance(value, str) else None


def column(dataset_cfg: dict, field: str) -> str:
    """The column name a dataset field names (its default when empty)."""
    defaults = {name: default for columns in FORMAT_COLUMNS.values() for name, (default, _) in columns.items()}
    return dataset_cfg.get(field) or defaults[field]


def _kind_of(value) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "true/false", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _label_of_row(value, index: int, columns: dict) -> bool:
    label = as_label(value)
    if label is None:
        raise JobError(
            f"dataset.label_field: row {index} of column {columns['label_field']!r} holds {value!r}, not "
            f"{KIND_NEEDS['label']}; fix that row"
        )
    return label
