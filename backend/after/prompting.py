"""How a typed prompt reaches the model, and the generation settings (no torch: the panel builds these).

A prompt is wrapped the way the run trained:
  chat     the tokenizer's chat template (messages data; any chat model), with the earlier turns
  alpaca   train.py's Alpaca prompt ("### Instruction: ... ### Response:")
  plain    the text as typed (prompt-completion and text data: the prompt field is all there was)
"auto" picks from the run's dataset.format.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from tunedeck.backend.recipe import ALPACA_PROMPT

TEMPLATES = ("auto", "chat", "alpaca", "plain")
MAX_NEW_TOKENS = 4096
EXPORT_CHECK_PROMPTS = 24  # held-out prompts an export check replays by default (backend/after/export_check.py)


class SettingsError(ValueError):
    """A generation setting out of range; the message names the setting and the fix."""


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy (the same answer every time)
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)  # the answer ends before the first of these

    def __post_init__(self):
        checks = (
            (
                "max_new_tokens",
                1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
                f"a whole number from 1 to {MAX_NEW_TOKENS}",
            ),
            ("temperature", 0 <= self.temperature <= 5, "from 0 (greedy) to 5"),
            ("top_p", 0 < self.top_p <= 1, "above 0 and at most 1"),
            ("repetition_penalty", 0 < self.repetition_penalty <= 10, "above 0 and at most 10 (1 = off)"),
        )
        for name, ok, what in checks:
            if not ok:
                raise SettingsError(f"{name}: {getattr(self, name)!r} is out of range; give {what}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SettingsError("stop: every stop string must be non-empty text")

    @classmethod
    def from_dict(cls, data: dict) -> GenerationSettings:
        try:
            return cls(
                max_new_tokens=int(data.get("max_new_tokens", cls.max_new_tokens)),
                temperature=float(data.get("temperature", cls.temperature)),
                top_p=float(data.get("top_p", cls.top_p)),
                repetition_penalty=float(data.get("repetition_penalty", cls.repetition_penalty)),
                stop=tuple(data.get("stop") or ()),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, SettingsError):
                raise
            raise SettingsError(
                f"generation settings: {exc}; give numbers for max_new_tokens, temperature, top_p and repetition_penalty"
            ) from None

    def to_dict(self) -> dict:
        return {**asdict(self), "stop": list(self.stop)}


def resolve_template(requested: str, dataset_format: str, has_chat_template: bool) -> str:
    """The template a prompt is wrapped in; SettingsError when chat is asked of a tokenizer without one."""
    if requested not in TEMPLATES:
        raise SettingsError(f"template: {requested!r} is not one of {', '.join(TEMPLATES)}")
    if requested == "auto":
        return {"messages": "chat", "alpaca": "alpaca"}.get(dataset_format, "plain")
    if requested == "chat" and not has_chat_template:
        raise SettingsError("template: the model's tokenizer has no chat template; use plain or alpaca")
    return requested


def wrap_plain(template: str, text: str) -> str:
    """The prompt text for the alpaca and plain templates (chat needs the tokenizer)."""
    if template == "alpaca":
        return ALPACA_PROMPT.format(instruction=text.strip())
    return text


def chat_messages(text: str, history: list[tuple[str, str]] | None = None, system: str = "") -> list[dict]:
    """The conversation the chat template renders: the system message, the earlier turns, the new prompt."""
    messages = [{"role": "system", "content": system}] if system.strip() else []
    for user, assistant in history or []:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages + [{"role": "user", "content": text}]


class StopTrimmer:
    """Streams text while holding back what could be the start of a stop string; ends at the first one."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""  # everything let through so far
        self.pending = ""
        self.stopped = False

    def feed(self, chunk: str) -> str:
        """The part of the stream that is safe to show now."""
        if self.stopped:
            return ""
        self.pending += chunk
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
        else:
            cut = max(0, len(self.pending) - self.hold)
            out, self.pending = self.pending[:cut], self.pending[cut:]
        self.text += out
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        self.text += out
        return out


ENDINGS = {
    "end": "ended at its end-of-sequence token",
    "stop string": "ended at a stop string",
    "max_new_tokens": "cut at max new tokens",
    "cancelled": "cancelled",
}


def answer_line(summary: dict) -> str:
    """How an answer went, from generate.stream's summary: "3 tokens in 0.21 s · ended at its end-of-sequence token"."""
    tokens, seconds = int(summary.get("new_tokens", 0)), float(summary.get("seconds", 0.0))
    ending = ENDINGS.get(summary.get("stop_reason", ""), str(summary.get("stop_reason", "")))
    if not str(summary.get("text", "")).strip() and summary.get("stop_reason") in ("end", "stop string"):
        return f"an empty answer: it {ending} at once ({tokens} token{'s' * (tokens != 1)})"
    rate = f", {tokens / seconds:.0f} tokens/s" if seconds > 0 and tokens > 1 else ""
    prompt = f" · the prompt {summary['prompt_tokens']} tokens" if summary.get("prompt_tokens") else ""
    return f"{tokens} token{'s' * (tokens != 1)} in {seconds:.2f} s{rate} · {ending}{prompt}"


def transcript(turns: Iterable[tuple[str, str]], prompt: str | None = None) -> str:
    """A conversation as the Try box shows it: each user turn after "> ", its answer under it, then the new prompt."""
    return "".join(f"> {user}\n{answer}\n\n" for user, answer in turns) + ("" if prompt is None else f"> {prompt}\n")
