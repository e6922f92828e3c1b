"""Stream an answer token by token from a loaded model. Imports torch: worker only.

transformers' TextIteratorStreamer hands decoded text from generate(), which runs in a thread;
stop strings end the answer (held back until they cannot be one: prompting.StopTrimmer), and a
cancel event stops generate() at its next token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from tunedeck.backend.after.prompting import GenerationSettings, StopTrimmer, chat_messages, wrap_plain


def encode_prompt(tokenizer, template: str, text: str, history=None, system: str = "") -> dict:
    """input_ids and attention_mask (batch of one) of the prompt in its template (history and system: chat only)."""
    if template == "chat":
        ids = tokenizer.apply_chat_template(
            chat_messages(text, history, system),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}
    return dict(tokenizer(wrap_plain(template, text), return_tensors="pt"))


def sampling_kwargs(settings: GenerationSettings, tokenizer) -> dict:
    kwargs = {
        "max_new_tokens": settings.max_new_tokens,
        "repetition_penalty": settings.repetition_penalty,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if settings.temperature > 0:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


class _Cancelled:
    """A StoppingCriteria (duck-typed: transformers calls it per step) that ends generation on request."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def stream(model, tokenizer, inputs: dict, settings: GenerationSettings, cancel: threading.Event) -> Iterator[str]:
    """Yield pieces of the answer as they are decoded; the generator's return value is a summary dict."""
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    halt = threading.Event()  # cancel from the caller, or a stop string seen here
    failure: list[BaseException] = []
    counted = {}

    def run():
        try:
            out = model.generate(
                **inputs,
                **sampling_kwargs(settings, tokenizer),
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([_Cancelled(halt)]),
            )
            counted["new_tokens"] = int(out.shape[1] - inputs["input_ids"].shape[1])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            failure.append(exc)
            streamer.end()

    started = time.monotonic()
    thread = threading.Thread(target=run, name="generate", daemon=True)
    thread.start()
    trimmer = StopTrimmer(settings.stop)
    for piece in streamer:
        if cancel.is_set():
            halt.set()
        shown = trimmer.feed(piece)
        if shown:
            yield shown
        if trimmer.stopped:
            halt.set()
    tail = trimmer.flush()
    if tail:
        yield tail
    thread.join()
    if failure:
        raise failure[0]
    reason = "cancelled" if cancel.is_set() else "stop string" if trimmer.stopped else "end"
    new_tokens = counted.get("new_tokens", 0)
    if reason == "end" and new_tokens >= settings.max_new_tokens:
        reason = "max_new_tokens"
    return {
        "text": trimmer.text,
        "new_tokens": new_tokens,
        "prompt_tokens": int(inputs["input_ids"].shape[1]),  # grows with a conversation's earlier turns
        "seconds": round(time.monotonic() - started, 3),
        "stop_reason": reason,
    }
