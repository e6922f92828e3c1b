"""Answers that survive export: held-out prompts answered greedily by the adapter (the base with the adapter through
PEFT, as Try answers) and by the exported model as it will be served, compared answer by answer. Worker only (torch).

The exported model as it will be served: a merged folder through transformers, with the tokenizer and the chat
template saved in that folder (what vLLM and `from_pretrained` read); a GGUF through llama.cpp's binding, with the
chat template and the EOS from its metadata. The report: how many answers agree exactly, the first differing
token of each that does not, and flags for what did not travel (no chat template, another one, another EOS): the
most common cause of answers that degrade after an export (hiyouga/LlamaFactory#6020, ollama/ollama#6823).
"""

from __future__ import annotations

from pathlib import Path

from tunedeck.backend.after.examples import Example, data_examples, pick
from tunedeck.backend.after.generate import encode_prompt, sampling_kwargs
from tunedeck.backend.after.prompting import (
    EXPORT_CHECK_PROMPTS,
    GenerationSettings,
    chat_messages,
    resolve_template,
    wrap_plain,
)
from tunedeck.backend.runs.checkpoints import AfterError, Weights
from tunedeck.backend.spec import JobSpec

MAX_NEW_TOKENS = 64


def check_export(
    run_dir: Path,
    job: JobSpec,
    weights: Weights,
    target: Path,
    device: str,
    count: int = EXPORT_CHECK_PROMPTS,
    progress=None,
) -> dict:
    """Replay `count` held-out prompts through the adapter and through `target` (a merged folder or a .gguf file)."""
    from tunedeck.backend.after.model_load import load_model

    target = Path(target)
    gguf = target.suffix == ".gguf"
    if not (target.is_file() if gguf else (target / "config.json").is_file()):
        raise AfterError(f"export check: {target} is neither a merged model folder (config.json) nor a .gguf file")
    say = progress or (lambda *a: None)
    pairs, source, held_out = data_examples(run_dir, job)
    examples = [pick(pairs, source, held_out, n) for n in range(1, min(count, len(pairs)) + 1)]
    say(f"answering {len(examples)} held-out prompts with {weights.describe()}", 0, 3)
    model, tokenizer = load_model(run_dir, job, weights, device)
    template = resolve_template("auto", job.dataset.format, bool(getattr(tokenizer, "chat_template", None)))
    want = [_answer_ids(model, tokenizer, template, example) for example in examples]
    del model
    say(f"answering them with {target.name} as it will be served", 1, 3)
    served = _gguf_answers(target, template, examples) if gguf else _merged_answers(target, template, examples)
    flags = served["flags"] + _eos_flags(tokenizer, served["eos"])
    if (
        template == "chat"
        and served["chat_template"] is not None
        and served["chat_template"] != tokenizer.chat_template
    ):
        flags.append("its chat template differs from the run's: prompts are wrapped otherwise than in training")
    differing = []
    for i, (wanted, got) in enumerate(zip(want, served["answers"])):
        if got != wanted:
            first = next((k for k, (a, b) in enumerate(zip(wanted, got)) if a != b), min(len(wanted), len(got)))
            differing.append(
                {
                    "prompt": examples[i].prompt,
                    "first_differing_token": first,
                    "adapter": tokenizer.decode(wanted, skip_special_tokens=True),
                    "exported": tokenizer.decode(got, skip_special_tokens=True) if got else "",
                }
            )
    say("compared", 3, 3)
    same = len(examples) - len(differing)
    return {
        "target": str(target),
        "prompts": len(examples),
        "identical": same,
        "source": source,
        "held_out": held_out,
        "template": template,
        "flags": flags,
        "differing": differing,
        "summary": f"{same}/{len(examples)} answers identical after export"
        + ("" if not flags else f"; {len(flags)} flag{'s' * (len(flags) > 1)}: " + "; ".join(flags)),
    }


def _answer_ids(model, tokenizer, template: str, example: Example) -> list[int]:
    """The greedy answer's token ids, up to and without the EOS."""
    import torch

    inputs = encode_prompt(tokenizer, template, example.prompt, list(example.turns), example.system)
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():  # greedy, as Try's default settings answer
        out = model.generate(**inputs, **sampling_kwargs(GenerationSettings(max_new_tokens=MAX_NEW_TOKENS), tokenizer))
    ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    return ids[: ids.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in ids else ids


def _merged_answers(folder: Path, template: str, examples: list[Example]) -> dict:
    """The merged folder's answers, with its own tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    chat_template = getattr(tokenizer, "chat_template", None)
    if template == "chat" and not chat_template:
        return {
            "answers": [[] for _ in examples],
            "flags": [f"{folder.name} has no chat template: a server cannot wrap a conversation as the run trained"],
            "chat_template": None,
            "eos": tokenizer.eos_token,
        }
    eos = model.generation_config.eos_token_id
    eos_text = tokenizer.convert_ids_to_tokens(eos if isinstance(eos, int) else (eos or [None])[0])
    return {
        "answers": [_answer_ids(model, tokenizer, template, example) for example in examples],
        "flags": [],
        "chat_template": chat_template,
        "eos": eos_text,
    }


def _gguf_answers(path: Path, template: str, examples: list[Example]) -> dict:
    """The GGUF's answers through llama.cpp, its chat template and EOS from its metadata."""
    # llama-cpp-python: dev.sh installs it beside the lint, so the type checker may not find it
    from llama_cpp import Llama  # pyright: ignore[reportMissingImports]
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # pyright: ignore[reportMissingImports]

    model = Llama(model_path=str(path), n_ctx=2048, verbose=False)
    try:
        meta = model.metadata
        chat_template = meta.get("tokenizer.chat_template")
        eos = model.detokenize([model.token_eos()], special=True).decode("utf-8", "replace")
        if template == "chat" and not chat_template:
            return {
                "answers": [[] for _ in examples],
                "flags": [f"{path.name} has no chat template in its metadata"],
                "chat_template": None,
                "eos": eos,
            }
        bos = model.detokenize([model.token_bos()], special=True).decode("utf-8", "replace")
        answers = []
        for example in examples:
            if template == "chat":  # as llama.cpp's chat completion does: the template writes any BOS itself
                messages = chat_messages(example.prompt, list(example.turns), example.system)
                formatter = Jinja2ChatFormatter(str(chat_template), eos_token=eos, bos_token=bos)
                text = formatter(messages=messages).prompt  # pyright: ignore[reportArgumentType] - plain dicts
                tokens = model.tokenize(text.encode(), add_bos=False, special=True)
            else:
                tokens = model.tokenize(wrap_plain(template, example.prompt).encode(), add_bos=True, special=True)
            answer = []
            for token in model.generate(tokens, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
                if model.token_eos() == token or len(answer) >= MAX_NEW_TOKENS:
                    break
                answer.append(token)
            answers.append(answer)
        return {"answers": answers, "flags": [], "chat_template": chat_template, "eos": eos}
    finally:
        model.close()


def _eos_flags(tokenizer, served_eos: str | None) -> list[str]:
    if served_eos is not None and served_eos != tokenizer.eos_token:
        return [
            f"it ends answers at {served_eos!r}, the run at {tokenizer.eos_token!r}: answers may run on or stop early"
        ]
    return []
