"""The project's vocabulary: the strategy kinds and the dataset formats, each described once.

Every layer reads these two tables: the spec (the allowed values, the dataset's column
fields), the form and validation (which fields apply, backend/spec/applies.py), the generators
(accelerate's distributed type, the bundle README), the memory model and the advisor, the
demo and the smoke run, and the recipe itself in every run (its gate's engines, the columns it reads: it ships
in every bundle with this module). docs/architecture.md says what else a new strategy kind or format touches.

No imports from tunedeck: this is the bottom of the core layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a job learns from, and the dataset formats of each objective: the Objective table's.
from .objectives_table import OBJECTIVE_FORMATS as OBJECTIVE_FORMATS

Engine = Literal["ddp", "deepspeed", "fsdp"]
Offload = Literal["cpu", "nvme"]


@dataclass(frozen=True)
class Strategy:
    kind: str  # the value of strategy.kind
    label: str  # short name in tables and advice, e.g. "ZeRO-3"
    title: str  # one line for people, e.g. in the bundle README
    engine: Engine  # what wraps the model (the start record's engine)
    zero_stage: int | None  # DeepSpeed's ZeRO stage
    shards: tuple[str, ...]  # what it splits across GPUs: optimizer states, gradients, parameters
    offload_optimizer: tuple[Offload, ...]  # where strategy.offload_optimizer may move the optimizer
    offload_params: tuple[Offload, ...]  # where strategy.offload_params may move the parameters
    distributed_type: str  # accelerate's distributed_type with more than one process

    @property
    def is_deepspeed(self) -> bool:
        return self.engine == "deepspeed"

    @property
    def is_fsdp(self) -> bool:
        return self.engine == "fsdp"

    @property
    def is_ddp(self) -> bool:
        return self.engine == "ddp"

    @property
    def shards_parameters(self) -> bool:
        return "parameters" in self.shards


STRATEGIES: dict[str, Strategy] = {
    s.kind: s
    for s in (
        # MULTI_GPU also on CPU: with use_cpu it runs real DDP over gloo, while MULTI_CPU starts one
        # process (measured, docs/notes/cpu-distributed.md).
        Strategy("ddp", "DDP", "DDP (a full model copy per process)", "ddp", None, (), (), (), "MULTI_GPU"),
        Strategy(
            "zero1", "ZeRO-1", "DeepSpeed ZeRO-1 (optimizer states sharded)",
            "deepspeed", 1, ("optimizer",), ("cpu",), (), "DEEPSPEED",
        ),
        Strategy(
            "zero2", "ZeRO-2", "DeepSpeed ZeRO-2 (optimizer states and gradients sharded)",
            "deepspeed", 2, ("optimizer", "gradients"), ("cpu",), (), "DEEPSPEED",
        ),
        Strategy(
            "zero3", "ZeRO-3", "DeepSpeed ZeRO-3 (optimizer states, gradients and parameters sharded)",
            "deepspeed", 3, ("optimizer", "gradients", "parameters"), ("cpu", "nvme"), ("cpu", "nvme"), "DEEPSPEED",
        ),
        # FSDP offloads parameters, gradients and the optimizer step together, to CPU RAM only.
        Strategy(
            "fsdp", "FSDP", "PyTorch FSDP (sharding as strategy.fsdp_sharding_strategy says)",
            "fsdp", None, ("optimizer", "gradients", "parameters"), ("cpu",), ("cpu",), "FSDP",
        ),
    )
}  # fmt: skip

# What a column's values must be; the recipe's KIND_NEEDS (formats.py) says each in words.
ColumnKind = Literal["text", "optional text", "text or chat", "chat", "label"]


@dataclass(frozen=True)
class Column:
    field: str  # the spec field that names the column: dataset.<field>
    default: str  # the column it names by default
    holds: str  # what the column holds, for the field's description
    kind: ColumnKind
    sft: str | None = None  # the SFTConfig argument that also names it (training_args.yaml)

    @property
    def required(self) -> bool:
        return self.kind != "optional text"


@dataclass(frozen=True)
class DatasetFormat:
    name: str  # the value of dataset.format
    summary: str  # a few words for people
    columns: tuple[Column, ...]  # what train_sft.py reads from each row
    trl_columns: tuple[str, ...]  # what TRL's trainer gets after train_sft.py converts the rows


DATASET_FORMATS: dict[str, DatasetFormat] = {
    f.name: f
    for f in (
        DatasetFormat(
            "text", "one text column, trained on whole",
            (Column("text_field", "text", "the text", "text", sft="dataset_text_field"),), ("text",),
        ),
        DatasetFormat(
            "prompt-completion", "a prompt and its completion, trained on the completion",
            (
                Column("prompt_field", "prompt", "the prompt", "text or chat"),
                Column("completion_field", "completion", "the completion", "text or chat"),
            ),
            ("prompt", "completion"),
        ),
        DatasetFormat(
            "messages", "a chat, rendered by the tokenizer's chat template",
            (Column("messages_field", "messages", "the chat messages", "chat"),), ("messages",),
        ),
        DatasetFormat(
            "alpaca", "instruction, optional input and output, turned into prompt-completion",
            (
                Column("instruction_field", "instruction", "the instruction", "text"),
                Column("input_field", "input", "the optional input", "optional text"),
                Column("output_field", "output", "the answer", "text"),
            ),
            ("prompt", "completion"),
        ),
        # Preference pairs train with DPO (objective=dpo), never with SFT: validate_method.objective_and_format.
        DatasetFormat(
            "preference", "a prompt with a chosen and a rejected answer, for DPO (objective=dpo)",
            (
                Column("prompt_field", "prompt", "the prompt", "text or chat"),
                Column("chosen_field", "chosen", "the preferred answer", "text or chat"),
                Column("rejected_field", "rejected", "the answer to prefer less", "text or chat"),
            ),
            ("prompt", "chosen", "rejected"),
        ),
        # Answers rated one at a time (thumbs up or down), for KTO (objective=kto): no pairs needed.
        DatasetFormat(
            "unpaired-preference", "a prompt, an answer and a label (true: good, false: bad), for KTO (objective=kto)",
            (
                Column("prompt_field", "prompt", "the prompt", "text or chat"),
                Column("completion_field", "completion", "the answer", "text or chat"),
                Column("label_field", "label", "whether the answer is good (true) or bad (false)", "label"),
            ),
            ("prompt", "completion", "label"),
        ),
        # Prompts alone, for GRPO (objective=grpo): the model writes the answers and the rewards score them;
        # the reference answer, when there is one, is what exact_answer and close_answer compare with.
        DatasetFormat(
            "prompt-only", "a prompt and, for the answer rewards, its reference answer, for GRPO (objective=grpo)",
            (
                Column("prompt_field", "prompt", "the prompt", "text or chat"),
                Column("answer_field", "answer", "the reference answer the answer rewards compare with", "optional text"),
            ),
            ("prompt", "answer"),
        ),
    )
}  # fmt: skip


def column_fields() -> dict[str, tuple[Column, list[str]]]:
    """Every column field of the dataset section, once, with the formats that read it (in table order)."""
    out: dict[str, tuple[Column, list[str]]] = {}
    for fmt in DATASET_FORMATS.values():
        for column in fmt.columns:
            out.setdefault(column.field, (column, []))[1].append(fmt.name)
    return out


# GRPO's built-in rewards (grpo.rewards), each scoring one written answer against the row's reference answer
# (dataset.answer_field). The recipe implements them under the same names (rewards.py: REWARD_FUNCTIONS;
# tests/spine/test_vocabulary.py checks that they agree). A reward may also be your own function: FILE.py:NAME.
REWARDS: dict[str, str] = {
    "exact_answer": "1 when the final answer (after the last '####', inside the last \\boxed{}, or the whole answer) "
    "equals the reference answer (numbers as numbers), else 0",
    "close_answer": "partial credit: a number off by d scores 1/(1+d); words score the share in the right place",
}
