"""The built-in demo: a tiny Llama, a tokenizer trained locally and a learnable dataset.

Everything comes from assets/demo/recipe.yaml, built deterministically with no
downloads, so anyone (and CI) can watch a real distributed run on a CPU machine.

    <demo_home>/model/           LlamaForCausalLM + tokenizer (with a chat template)
    <demo_home>/data/train.jsonl  prompt-completion records (+ eval.jsonl)
    <demo_home>/preference/       the same rows as preference pairs, for DPO: train.jsonl,
                                  validation.jsonl (chosen: the answer; rejected: the question restated)
    <demo_home>/unpaired/         the same rows as answers labelled good or bad, one a row, for KTO
    <demo_home>/prompts/          the same questions alone with their reference answers, for GRPO
    <demo_home>/model-sft/        the model after a short supervised warm-up (GRPO's start: a model that
                                  never answers right earns no reward to learn from)
    <demo_home>/formats/<f>.jsonl the same task in each dataset format: text,
                                  prompt-completion, messages, alpaca, preference, unpaired-preference,
                                  prompt-only
    <demo_home>/BUILD             stamp: which recipe and builder made this folder

`ensure_demo()` is cheap when the demo is built; otherwise it runs the build in a
subprocess (`python -m tunedeck.backend.data.demo`), so the panel never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, OBJECTIVE_FORMATS
from tunedeck.backend.spec import PACKAGE_DIR, demo_home

RECIPE_PATH = PACKAGE_DIR / "assets" / "demo" / "recipe.yaml"
FORMATS = tuple(DATASET_FORMATS)

# Assistant turns are wrapped in {% generation %} so TRL's assistant_only_loss works too.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}{{ '\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def build_stamp() -> str:
    """Identity of a build: the recipe and this builder's code. A change of either rebuilds."""
    digest = hashlib.sha256(RECIPE_PATH.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def is_built(home: Path) -> bool:
    try:
        return json.loads((home / "BUILD").read_text())["stamp"] == build_stamp()
    except (OSError, ValueError, KeyError):
        return False


def ensure_demo(home: Path | None = None) -> Path:
    """Build the demo once (in a subprocess: torch stays out of the caller) and return its folder."""
    home = Path(home) if home is not None else demo_home()
    if is_built(home):
        return home
    result = subprocess.run(
        [sys.executable, "-m", "tunedeck.backend.data.demo", "--home", str(home)],
        cwd=PACKAGE_DIR,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    if result.returncode != 0 or not is_built(home):
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"building the demo in {home} failed (python -m tunedeck.backend.data.demo --home {home}):\n{tail}"
        )
    return home


def ensure_demo_if_used(spec) -> None:
    """Build the demo when a job points into its folder (the demo preset does): a no-op otherwise."""
    home = str(demo_home())
    if str(spec.model.name_or_path).startswith(home) or str(spec.dataset.path).startswith(home):
        ensure_demo()


@contextlib.contextmanager
def _build_lock(home: Path):
    # Several processes (tests, the panel, the CLI) may ask for the demo at once: one builds.
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_demo(home: Path) -> Path:
    """Build the demo into `home` (replacing an outdated build). Imports torch: call in a subprocess."""
    home = Path(home)
    with _build_lock(home):
        if is_built(home):
            return home
        recipe = yaml.safe_load(RECIPE_PATH.read_text(encoding="utf-8"))
        staging = home.parent / f".{home.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        examples = _write_datasets(staging, recipe)
        tokenizer = _train_tokenizer(staging / "model", recipe, examples)
        n_params = _build_model(staging / "model", recipe, tokenizer)
        _warm_up(staging, recipe, tokenizer)
        (staging / "BUILD").write_text(
            json.dumps({"stamp": build_stamp(), "parameters": n_params, "vocab_size": len(tokenizer)}, indent=2) + "\n"
        )
        if home.exists():
            shutil.rmtree(home)
        staging.rename(home)
    return home


# ---------------------------------------------------------------- the task


def make_examples(rng: random.Random, count: int, data: dict) -> list[dict]:
    """Small instruction tasks a tiny model learns in a few dozen steps: sums, differences, reversals."""
    examples = []
    for _ in range(count):
        kind = rng.choice(("add", "subtract", "reverse"))
        if kind == "reverse":
            n = rng.randint(data["min_letters"], data["max_letters"])
            letters = [rng.choice(data["letters"]) for _ in range(n)]
            instruction, given = "Reverse the letters.", " ".join(letters)
            answer = " ".join(reversed(letters))
        else:
            a, b = rng.randint(0, data["max_number"]), rng.randint(0, data["max_number"])
            if kind == "subtract":
                a, b = max(a, b), min(a, b)
            op = "+" if kind == "add" else "-"
            instruction, given = ("Add the numbers." if kind == "add" else "Subtract the numbers."), f"{a} {op} {b}"
            answer = str(a + b if kind == "add" else a - b)
        examples.append({"instruction": instruction, "input": given, "answer": answer})
    return examples


def as_format(example: dict, fmt: str) -> dict:
    """One example in one of the spec's dataset formats (backend/recipe/vocabulary.py), under its default columns."""
    question = f"{example['instruction']} {example['input']}"
    if fmt == "prompt-completion":
        return {"prompt": f"Q: {question}\nA:", "completion": f" {example['answer']}"}
    if fmt == "text":
        return {"text": f"Q: {question}\nA: {example['answer']}"}
    if fmt == "messages":
        return {
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": example["answer"]},
            ]
        }
    if fmt == "alpaca":
        return {"instruction": example["instruction"], "input": example["input"], "output": example["answer"]}
    if fmt == "preference":
        return {"prompt": f"Q: {question}\nA:", "chosen": f" {example['answer']}", "rejected": f" {restated(example)}"}
    if fmt == "unpaired-preference":
        return {"prompt": f"Q: {question}\nA:", "completion": f" {example['answer']}", "label": True}
    if fmt == "prompt-only":
        return {"prompt": f"Q: {question}\nA:", "answer": example["answer"]}
    raise ValueError(f"unknown dataset format {fmt!r}; expected one of {', '.join(FORMATS)}")


def restated(example: dict) -> str:
    """The rejected answer of a demo pair: the question given back (the sum unsummed, the letters not reversed).

    A near miss (a number off by one) is what real pairs look like, but this random-weight model knows no
    arithmetic to tell them apart: 60 DPO steps left its reward accuracy at chance (measured); against the
    question restated it climbs from about 0.5 to 0.8 and the loss falls from ln 2 to about 0.2.
    """
    return example["input"]


def paired(examples: list[dict]) -> list[dict]:
    """The examples that make a preference pair: not the palindromes ("a a" reversed), whose restated
    question is the right answer."""
    return [e for e in examples if restated(e) != e["answer"]]


def unpaired(examples: list[dict]) -> list[dict]:
    """The KTO demo's rows, as real thumbs-up/down data comes: one answer per question, never both. Of the
    examples that make a pair, every other one gives its answer (good), the others their question restated (bad)."""
    rows = []
    for i, example in enumerate(paired(examples)):
        pair = as_format(example, "preference")
        good = i % 2 == 0
        rows.append({"prompt": pair["prompt"], "completion": pair["chosen" if good else "rejected"], "label": good})
    return rows


def _format_rows(examples: list[dict], fmt: str) -> list[dict]:
    if fmt == "unpaired-preference":
        return unpaired(examples)
    return [as_format(e, fmt) for e in (paired(examples) if fmt == "preference" else examples)]


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _write_datasets(root: Path, recipe: dict) -> list[dict]:
    data = recipe["data"]
    rng = random.Random(recipe["seed"])
    train = make_examples(rng, data["train_examples"], data)
    evaluation = make_examples(rng, data["eval_examples"], data)
    _write_jsonl(root / "data" / "train.jsonl", [as_format(e, "prompt-completion") for e in train])
    _write_jsonl(root / "data" / "eval.jsonl", [as_format(e, "prompt-completion") for e in evaluation])
    for folder, fmt in (("preference", "preference"), ("unpaired", "unpaired-preference"), ("prompts", "prompt-only")):
        _write_jsonl(root / folder / "train.jsonl", _format_rows(train, fmt))
        _write_jsonl(root / folder / "validation.jsonl", _format_rows(evaluation, fmt))
    sample = train[: data["format_examples"]]
    for fmt in FORMATS:
        _write_jsonl(root / "formats" / f"{fmt}.jsonl", _format_rows(sample, fmt))
    return train + evaluation


# ---------------------------------------------------------------- tokenizer and model


def _train_tokenizer(model_dir: Path, recipe: dict, examples: list[dict]):
    """A SentencePiece BPE model (tokenizer.model), as Llama's own: llama.cpp's converter reads its vocabulary
    as it is (GGUF export), where a byte-level BPE trained here is refused (its pre-tokenizer is recognized by
    the hash of a known model's vocabulary only). Each digit its own token (numbers stay learnable), unknown
    characters as bytes (any text encodes), text kept as it is (no normalization: newlines are the format)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    spec = recipe["tokenizer"]
    control = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
    roles = [token for token in spec["special_tokens"] if token not in control.values()]
    corpus = []
    for example in examples:
        # Only the SFT formats: the others hold the same texts, and the tokenizer (so the demo model) stays as
        # it was before DPO came, with the measurements made on it (recipe.yaml).
        for fmt in OBJECTIVE_FORMATS["sft"]:
            record = as_format(example, fmt)
            corpus.append(json.dumps(record, ensure_ascii=False))
            corpus.extend(str(v) for v in record.values() if isinstance(v, str))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        model_type="bpe",
        vocab_size=spec["vocab_size"],
        hard_vocab_limit=False,  # the demo's texts hold fewer pieces than vocab_size allows
        character_coverage=1.0,
        split_digits=True,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        user_defined_symbols=roles,
        unk_id=0,  # Llama's ids: <unk> 0, <s> 1, </s> 2
        bos_id=1,
        eos_id=2,
        pad_id=3,
        unk_piece=control["unk"],
        bos_piece=control["bos"],
        eos_piece=control["eos"],
        pad_piece=control["pad"],
        num_threads=1,  # the same model on every machine
        minloglevel=2,
    )
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "tokenizer.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "LlamaTokenizer",
        **{f"{name}_token": piece for name, piece in control.items()},
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "model_max_length": recipe["model"]["max_position_embeddings"],
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # from_pretrained records how it was called (HF_HUB_OFFLINE=1: "local_files_only": true), which would make the
    # saved files depend on the environment of the build.
    tokenizer.init_kwargs.pop("local_files_only", None)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    return tokenizer


def _build_model(model_dir: Path, recipe: dict, tokenizer) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe["seed"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **recipe["model"],
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, recipe["lm_head_init_std"])
    model.save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


def _warm_up(root: Path, recipe: dict, tokenizer) -> None:
    """model-sft/: the demo model after a few supervised steps on its training rows (a plain loop, no TRL), the
    start of the GRPO demo. GRPO learns only from answers that score differently: from the random model every
    answer scores 0 (measured: 60 steps, no reward), from this one about 1 in 5 is right and the rest near misses."""
    import torch
    from transformers import LlamaForCausalLM

    warm = recipe["warm_up"]
    torch.manual_seed(recipe["seed"])
    rng = random.Random(recipe["seed"])
    model = LlamaForCausalLM.from_pretrained(root / "model")
    rows = []
    for line in (root / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        prompt = tokenizer(row["prompt"])["input_ids"]
        answer = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))  # the loss on the answer only
    optimizer = torch.optim.AdamW(model.parameters(), lr=warm["learning_rate"])
    model.train()
    for _ in range(warm["steps"]):
        batch = rng.sample(rows, warm["batch_size"])
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([label + [-100] * (width - len(label)) for _, label in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(root / "model-sft")
    tokenizer.save_pretrained(root / "model-sft")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny demo model, tokenizer and dataset (no downloads).")
    parser.add_argument("--home", type=Path, default=None, help="target folder (default: $TUNEDECK_HOME/demo)")
    args = parser.parse_args(argv)
    home = build_demo(args.home or demo_home())
    print(home)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
