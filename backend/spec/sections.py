"""The job spec's sections on what is trained: model, LoRA, quantization, dataset (training: spec_training.py).

A JobSpec (backend/spec/job.py, with the sections on how it runs: strategy and launch) is
one typed, validated description of a fine-tuning job; presets, forms, uploaded YAML and the
CLI all produce one, and every generated file is a pure function of one. Field names follow
the Hugging Face name wherever one exists (PEFT's LoraConfig, bitsandbytes'
BitsAndBytesConfig, TRL's SFTConfig, accelerate's launch options), so a reader of either
side recognises the other.

A field says where it goes: an `SftField` is a TRL SFTConfig argument, which
training_args.yaml copies by name whenever the field applies (backend/spec/applies.py). The
dataset formats and their column fields come from backend/recipe/vocabulary.py.

These modules check what one field alone can check (types, ranges, choices, one line of
visible text); rules across fields live in validate.py, reading and naming fields in
spec_parse.py, untrusted YAML in untrusted.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic.config import JsonDict

from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, column_fields
from tunedeck.backend.spec.mix import entries_from_text, rows_key
from tunedeck.backend.spec.untrusted import describe_char, unsafe_char

Dtype = Literal["bfloat16", "float16", "float32"]
if TYPE_CHECKING:  # a Literal built from the table is one pydantic checks at run time; the type checker reads str
    DatasetFormatName = str
else:
    DatasetFormatName = Literal[tuple(DATASET_FORMATS)]

# Upper bounds that no real job reaches, so that a form cannot ask for the absurd (an ETA of
# 10^24 hours, a 5,000-digit seed the trainer refuses only after loading the model).
MAX_STEPS = 10_000_000  # optimizer steps; Llama 2's pretraining took 500,000
MAX_ELEMENTS = 10**12  # DeepSpeed bucket and parameter counts: more than any model's parameters
MAX_TEXT = 4096  # characters in one text field: PATH_MAX on Linux, longer than any name or path
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Elements = Annotated[int, Field(ge=1, le=MAX_ELEMENTS)]
SFT_CONFIG = "sft_config"  # the json_schema_extra key that holds a field's SFTConfig argument name

# Every field has a `title` (the human label the form, `tunedeck schema` and docs/job-spec.md show)
# and a `description` (its one-line help); tests/panel/test_field_labels.py fails for a field without
# either. A field marked basic is shown in its section's first view; the others fold into Advanced.
BASIC_KEY = "basic"
BASIC: JsonDict = {BASIC_KEY: True}  # json_schema_extra of a basic field: Field(..., json_schema_extra=BASIC)


def SftField(default: Any, *, sft: str | None = None, basic: bool = False, **kwargs: Any) -> Any:
    """A Field that is also an argument `sft` of TRL's SFTConfig or DPOConfig (default: the field's own name).

    training_args.yaml copies it there by that name whenever the field applies (render/training_args.py).
    """
    return Field(default=default, json_schema_extra={SFT_CONFIG: sft or True, **(BASIC if basic else {})}, **kwargs)


def unique_entries(entries: list[str], key_of: Callable[[str], Hashable], again: str) -> list[str]:
    """A list field's entries, stripped: each checked by key_of (ValueError: its problem), none twice (the same
    key; `again` says so, with {first}: the earlier item's number and {key}); an error names the item's number."""
    seen: dict[Hashable, int] = {}
    for number, entry in enumerate(entries, start=1):
        try:
            key = key_of(entry)
        except ValueError as exc:
            raise ValueError(f"item {number}: {exc}") from None
        if key in seen:
            raise ValueError(f"item {number}: " + again.format(first=seen[key], key=key))
        seen[key] = number
    return [entry.strip() for entry in entries]


class SpecSection(BaseModel):
    # Unknown keys are typos: refuse them rather than silently ignore them. inf/nan pass the
    # range checks of some fields, then crash the trainer (math.ceil(inf epochs)): refuse them too.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value: Any) -> Any:
        """Every text of the spec (str fields and list items): one line of visible characters.

        Spec values reach shell scripts, YAML files and terminals; a newline in one ended a
        comment of launch.sh and ran the next line (issue 8). One check here covers every
        field, including ones added later.
        """
        items = value if isinstance(value, list) else [value]
        for number, text in enumerate(items, start=1):
            if not isinstance(text, str):
                continue
            which = f"item {number} " if isinstance(value, list) else ""
            if len(text) > MAX_TEXT:
                raise ValueError(f"{which}is {len(text):,} characters long; no name or path is longer than {MAX_TEXT}")
            index = unsafe_char(text)
            if index is not None:
                raise ValueError(
                    f"{which}contains {describe_char(text[index])} at character {index + 1}: "
                    "a text field is one line of visible characters; remove it"
                )
        return value


class ModelSpec(SpecSection):
    name_or_path: str = Field(
        default="meta-llama/Llama-2-7b-hf",
        min_length=1,
        title="Base model",
        json_schema_extra=BASIC,
        description="Hugging Face hub id or local folder of the base model (config.json, weights, tokenizer).",
    )
    dtype: Dtype = Field(
        default="bfloat16",
        title="Weights dtype",
        json_schema_extra=BASIC,
        description="dtype the base weights are loaded in (from_pretrained dtype). bfloat16 needs an Ampere or newer GPU.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        default="sdpa",
        title="Attention kernel",
        description="Attention kernel: sdpa (PyTorch built-in, works everywhere), flash_attention_2 (needs the flash-attn package and a 16-bit dtype), eager.",
    )
    trust_remote_code: bool = Field(
        default=False,
        title="Trust remote code",
        description="Run Python code shipped with the model repository. Only for repositories you trust.",
    )
    revision: str | None = Field(
        default=None,
        title="Model revision",
        description="Hub branch, tag or commit of the model; empty for the default branch.",
    )


class LoraSpec(SpecSection):
    r: int = Field(
        default=16,
        ge=1,
        le=1024,
        title="LoRA rank",
        json_schema_extra=BASIC,
        description="LoRA rank: size of the low-rank update. 8-64 is typical.",
    )
    lora_alpha: int = Field(
        default=32,
        ge=1,
        le=4096,
        title="LoRA alpha",
        json_schema_extra=BASIC,
        description="LoRA scaling numerator (update scaled by lora_alpha / r). Usually 2 x r.",
    )
    lora_dropout: float = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        title="LoRA dropout",
        description="Dropout on the LoRA input, 0 to <1. 0.05 is typical.",
    )
    target_modules: Literal["all-linear"] | Annotated[list[str], Field(max_length=1000)] = Field(
        default="all-linear",
        title="Target modules",
        json_schema_extra=BASIC,
        description="Modules that get adapters: 'all-linear' or module names such as q_proj,k_proj,v_proj,o_proj.",
    )
    bias: Literal["none", "all", "lora_only"] = Field(
        default="none", title="Trained biases", description="Which biases are trained."
    )
    use_dora: bool = Field(
        default=False, title="DoRA", description="Weight-decomposed LoRA (DoRA): a little better, slower per step."
    )
    use_rslora: bool = Field(
        default=False,
        title="rsLoRA",
        description="Rank-stabilised LoRA: scale the update by lora_alpha / sqrt(r) instead of lora_alpha / r, so "
        "high ranks keep learning (arXiv:2312.03732).",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        # Forms and --set give "q_proj, v_proj"; PEFT wants a list (or the "all-linear" shortcut).
        if isinstance(value, str) and value.strip() != "all-linear":
            return [part.strip() for part in value.split(",") if part.strip()]
        return value.strip() if isinstance(value, str) else value


class QuantizationSpec(SpecSection):
    bits: Literal[4, 8] | None = Field(
        default=None,
        title="Quantized base",
        json_schema_extra=BASIC,
        description="Load the base model quantized with bitsandbytes: 4 (QLoRA), 8, or empty for no quantization.",
    )
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(
        default="nf4",
        title="4-bit data type",
        description="4-bit data type. NF4 suits normally distributed weights (QLoRA paper).",
    )
    bnb_4bit_use_double_quant: bool = Field(
        default=True,
        title="Double quantization",
        description="Quantize the quantization constants too: saves about 0.37 bits per parameter.",
    )
    bnb_4bit_compute_dtype: Dtype = Field(
        default="bfloat16",
        title="4-bit compute dtype",
        description="dtype of the matmuls on dequantized 4-bit weights.",
    )
    bnb_4bit_quant_storage: Literal["uint8", "bfloat16", "float16", "float32"] = Field(
        default="uint8",
        title="4-bit storage dtype",
        description="Storage dtype of packed 4-bit weights. ZeRO-3 and FSDP need it equal to the compute dtype so they can shard it.",
    )


class _DatasetSource(SpecSection):
    path: str = Field(
        default="timdettmers/openassistant-guanaco",
        min_length=1,
        title="Dataset",
        json_schema_extra=BASIC,
        description="Local JSON/JSONL/CSV/Parquet file or folder, or a Hugging Face hub dataset id.",
    )
    name: str | None = Field(
        default=None, title="Hub configuration", description="Dataset configuration name on the hub, if it has several."
    )
    split: str = Field(
        default="train",
        min_length=1,
        title="Training split",
        description="Training split; slices work, e.g. train[:95%].",
    )
    eval_split: str | None = Field(
        default=None,
        title="Evaluation split",
        description="Evaluation split, e.g. test or train[95%:]; empty for no evaluation.",
    )
    format: DatasetFormatName = Field(
        default="text",
        title="Row format",
        json_schema_extra=BASIC,
        description="Record layout: " + "; ".join(f"{f.name}: {f.summary}" for f in DATASET_FORMATS.values()) + ".",
    )


# The column fields (text_field, prompt_field, ...) come from the dataset-format table, one per
# column a format reads. create_model puts them after the source fields and DatasetSpec's own after
# them: the form, job.yaml and the docs list fields in declaration order.
_COLUMNS: dict[str, Any] = {  # field name -> (type, Field): create_model's keyword arguments
    name: (
        str,
        Field(
            default=column.default,
            title=f"{name.removesuffix('_field').capitalize()} column",
            description=f"Column holding {column.holds} (format {' or '.join(formats)}).",
            # The chosen format's columns are few (the others are hidden): part of the first view.
            json_schema_extra={**BASIC, **({SFT_CONFIG: column.sft} if column.sft else {})},
        ),
    )
    for name, (column, formats) in column_fields().items()
}
_DatasetColumns = create_model("_DatasetColumns", __base__=_DatasetSource, **_COLUMNS)


class DatasetSpec(_DatasetColumns):  # type: ignore[misc, valid-type]
    max_seq_length: int = SftField(
        2048,
        sft="max_length",
        ge=8,
        le=1_048_576,
        title="Max sequence length",
        basic=True,
        description="Longest sequence in tokens; longer examples are truncated.",
    )
    # On by default: bench/bench_recipe.py measures it (docs/methods.md, "Fast defaults"); tests/runs/test_packing.py
    # proves the packed loss equals the unpacked one (rows never attend across each other).
    packing: bool = SftField(
        True,
        title="Packing",
        basic=True,
        description="Pack several rows into each max_seq_length sequence (TRL best-fit decreasing; rows never attend to "
        "each other, and a row longer than max_seq_length is cut first, as without packing): no padding, "
        "3.5x the useful tokens/s of rows padded to max_length on chat-like data (bench/bench_recipe.py).",
    )
    assistant_only_loss: bool = SftField(
        False,
        title="Assistant turns only",
        description="Train on the assistant turns only (the chat template must mark them with {% generation %}); "
        "false trains on the whole chat.",
    )
    mix: Annotated[list[str], Field(max_length=16)] = Field(
        default_factory=list,
        title="Mixed-in datasets",
        description="More training rows: SOURCE[@CONFIG][:SPLIT][#ROWS] each, comma-separated, e.g. "
        "/data/general.jsonl#2000 or HuggingFaceH4/ultrachat_200k:train_sft#5000. #ROWS samples that many "
        "(repeating a smaller source); without it, every row. In this job's format and columns, or in another "
        "its columns name (messages; instruction, input, output; prompt, completion; text), converted: a prompt "
        "and its answer become a chat for a messages job, one text for a text job. With an evaluation split, each "
        "source is also evaluated on its rows of that split (give the entry's own split, e.g. :train[:95%], to keep "
        "them out of training); an SFT run without packing logs each source's loss.",
    )

    general_text: str | None = Field(
        default=None,
        title="General-text check",
        description="At each evaluation, also the loss on general prose: built-in (a 6 KB sample shipped with "
        "tunedeck) or a plain-text file of your own. A rise over the loss before the first step means the model is "
        "forgetting general language (the run's summary flags more than +5%). SFT with an evaluation split; empty "
        "for none.",
    )

    @field_validator("general_text", mode="before")
    @classmethod
    def _general_text_or_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("mix", mode="before")
    @classmethod
    def _mix_from_text(cls, value: Any) -> Any:
        return entries_from_text(value)

    @field_validator("mix")
    @classmethod
    def _mix_entries(cls, value: list[str]) -> list[str]:
        return unique_entries(value, rows_key, "the same rows as item {first}: give one entry more rows (#ROWS)")
