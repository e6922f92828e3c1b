"""train.py's data loading: the spec's four formats and file types, mapped to what TRL's SFTTrainer reads.

The mapped datasets go through TRL's own preparation (tokenization, EOS, completion
masks) so a wrong mapping fails here, not minutes into a run.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from tunedeck.backend import recipe

FORMAT_SPECS = {
    "text": {"format": "text"},
    "prompt-completion": {"format": "prompt-completion"},
    "messages": {"format": "messages"},
    "alpaca": {"format": "alpaca"},
}


@pytest.fixture(scope="module")
def tokenizer(demo_home):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_home / "model")


def sft_args(tmp_path, **extra):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", max_length=64, **extra
    )


@pytest.mark.parametrize("fmt", list(FORMAT_SPECS))
def test_each_format_becomes_trl_input_with_the_answer_trained(fmt, demo_home, tokenizer, tmp_path):
    from trl import SFTTrainer

    job = {
        "model": {"name_or_path": str(demo_home / "model")},
        "dataset": {"path": str(demo_home / "formats" / f"{fmt}.jsonl"), **FORMAT_SPECS[fmt]},
    }
    args = sft_args(tmp_path)
    train_set, eval_set, _ = recipe.load_datasets(job, args, tokenizer)
    assert eval_set is None
    expected = {
        "text": {"text"},
        "prompt-completion": {"prompt", "completion"},
        "messages": {"messages"},
        "alpaca": {"prompt", "completion"},
    }
    assert set(train_set.column_names) == expected[fmt]
    # A real SFTTrainer prepares it, and the first example's answer is among the trained tokens.
    trainer = SFTTrainer(
        model=str(demo_home / "model"), args=args, train_dataset=train_set.select(range(4)), processing_class=tokenizer
    )
    row = trainer.train_dataset[0]
    trained = tokenizer.decode([label for label in row["labels"] if label != -100])
    first_answer = json.loads((demo_home / "formats" / "alpaca.jsonl").read_text().splitlines()[0])["output"]
    assert first_answer in trained
    if fmt != "text":  # prompt-completion and alpaca train on the answer only; messages on the whole chat
        assert "Q:" not in trained and "Instruction" not in trained


def test_alpaca_prompt_with_and_without_input(tmp_path, tokenizer):
    path = tmp_path / "alpaca.jsonl"
    rows = [
        {"instruction": "Add the numbers.", "input": "1 + 2", "output": "3"},
        {"instruction": "Say hi.", "input": "", "output": "hi"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = {"model": {"name_or_path": "x"}, "dataset": {"path": str(path), "format": "alpaca"}}
    data, *_ = recipe.load_datasets(job, sft_args(tmp_path), tokenizer)
    assert data[0]["prompt"] == "### Instruction:\nAdd the numbers.\n\n### Input:\n1 + 2\n\n### Response:\n"
    assert data[1]["prompt"] == "### Instruction:\nSay hi.\n\n### Response:\n"
    assert [data[0]["completion"], data[1]["completion"]] == ["3", "hi"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_csv_parquet_json_files_and_custom_columns(suffix, demo_home, tokenizer, tmp_path):
    from datasets import load_dataset

    source = load_dataset("json", data_files=str(demo_home / "formats" / "prompt-completion.jsonl"), split="train")
    source = source.rename_columns({"prompt": "question", "completion": "answer"})
    path = tmp_path / f"data{suffix}"
    {".csv": source.to_csv, ".parquet": source.to_parquet, ".json": source.to_json}[suffix](str(path))
    job = {
        "model": {"name_or_path": "x"},
        "dataset": {
            "path": str(path),
            "format": "prompt-completion",
            "prompt_field": "question",
            "completion_field": "answer",
            "split": "train[:90%]",
            "eval_split": "train[90%:]",
        },
    }
    train_set, eval_set, _ = recipe.load_datasets(job, sft_args(tmp_path), tokenizer)
    assert len(train_set) + len(eval_set) == len(source) and len(eval_set) == len(source) // 10
    assert train_set[0] == {"prompt": source[0]["question"], "completion": source[0]["answer"]}


def test_data_errors_name_the_field(demo_home, tokenizer, tmp_path):
    args = sft_args(tmp_path)
    missing = {"model": {"name_or_path": "x"}, "dataset": {"path": str(tmp_path / "nope.jsonl"), "format": "text"}}
    with pytest.raises(recipe.JobError, match=r"dataset.path: .*nope.jsonl does not exist"):
        recipe.load_datasets(missing, args, tokenizer)
    wrong_column = {
        "model": {"name_or_path": "x"},
        "dataset": {"path": str(demo_home / "formats" / "text.jsonl"), "format": "prompt-completion"},
    }
    with pytest.raises(
        recipe.JobError, match=r"dataset.prompt_field: column 'prompt' is not in the dataset \(columns: text\)"
    ):
        recipe.load_datasets(wrong_column, args, tokenizer)
    odd = tmp_path / "data.xml"
    odd.write_text("<x/>")
    with pytest.raises(recipe.JobError, match=r"dataset.path: .* not a .json, .jsonl, .csv or .parquet file"):
        recipe.load_datasets(
            {"model": {"name_or_path": "x"}, "dataset": {"path": str(odd), "format": "text"}}, args, tokenizer
        )


def test_messages_without_chat_template_is_refused(demo_home, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
    tokenizer.chat_template = None
    job = {
        "model": {"name_or_path": "plain-model"},
        "dataset": {"path": str(demo_home / "formats" / "messages.jsonl"), "format": "messages"},
    }
    with pytest.raises(recipe.JobError, match="messages needs a chat template.*plain-model"):
        recipe.load_datasets(job, sft_args(tmp_path), tokenizer)


def test_quantization_config_from_job():
    import torch

    config = recipe.quantization_config(
        {
            "quantization": {
                "bits": 4,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": "bfloat16",
                "bnb_4bit_quant_storage": "bfloat16",
            }
        }
    )
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16 and config.bnb_4bit_quant_storage == torch.bfloat16
    assert recipe.quantization_config({"quantization": {"bits": None}}) is None
    assert recipe.quantization_config({"quantization": {"bits": 8}}).load_in_8bit


# The bundle runs on cluster nodes without tunedeck: train.py may import only these.
ALLOWED_THIRD_PARTY = {
    "yaml",
    "torch",
    "transformers",
    "trl",
    "peft",
    "datasets",
    "accelerate",
    "deepspeed",
    "bitsandbytes",
    "psutil",  # comes with accelerate: the telemetry's host readings
    "pynvml",  # nvidia-ml-py, in every bundle's requirements.txt: the telemetry's GPU readings
}


def test_the_recipe_imports_only_the_hugging_face_stack_and_itself():
    package = Path(recipe.__file__).parent
    siblings = {path.stem for path in package.glob("*.py")}
    imported = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:  # a sibling, by a name that works in any package
                assert node.level == 1 and (node.module or "").split(".")[0] in siblings, (path.name, node.module)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "__future__"}
    assert third_party <= ALLOWED_THIRD_PARTY, third_party - ALLOWED_THIRD_PARTY
