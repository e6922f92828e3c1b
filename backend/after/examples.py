"""Examples to try a run with: a prompt from its data, typed as the Try box wraps it, and the data's answer.

The prompt is what the Try box sends through the run's template (prompting.resolve_template):
prompt-completion rows as they are, an alpaca row as its instruction (and input) so that
wrapping it again gives back the prompt the model trained on, a conversation as its last user
message, with its system message and earlier turns to send before it. Held-out rows (the run's
evaluation data) come first; without any, the training rows, which the model has seen. A
plain-text dataset has no prompt and answer to split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.after.eval_data import NoEvalData
from tunedeck.backend.after.scoring import (
    contains_match,
    eval_rows,
    exact_match,
    question_and_answer,
    rouge_l,
    training_rows,
)
from tunedeck.backend.recipe import ALPACA_PROMPT
from tunedeck.backend.runs.checkpoints import AfterError
from tunedeck.backend.spec import JobSpec

ROWS_READ = 500  # the examples are drawn from the first rows of the data
_ALPACA_HEAD, _ALPACA_TAIL = ALPACA_PROMPT.split("{instruction}")


class NoExamples(AfterError):
    """The run's data has no prompt and answer to take."""


@dataclass(frozen=True)
class Example:
    prompt: str  # the text to type
    expected: str | None  # the data's answer; None for a prompt it has none to (the answers table's rows)
    number: int  # 1-based, among the rows with an answer
    count: int
    source: str
    held_out: bool
    system: str = ""  # a conversation's system message
    turns: tuple[tuple[str, str], ...] = ()  # a conversation's earlier (user, assistant) turns
    left_out: int = 0  # earlier messages that are not user and assistant turns: the Try box cannot send them

    def describe(self) -> str:
        kind = "held-out row" if self.held_out else "training row (the model has seen it)"
        where = Path(self.source).name or self.source
        context = ["its system message"] * bool(self.system)
        context += [f"{len(self.turns)} earlier turn{'s' * (len(self.turns) > 1)}"] * bool(self.turns)
        with_context = f" · with {' and '.join(context)}" if context else ""
        dropped = f" · its {self.left_out} earlier message{'s' * (self.left_out > 1)} not sent" if self.left_out else ""
        unanswered = " · the data has no answer to it" if self.expected is None else ""
        return f"example {self.number} of {self.count}, a {kind} of {where}{with_context}{dropped}{unanswered}"


def typed(prompt: object) -> dict:
    """What the Try box sends for a row's prompt: the text to type and, of a conversation, its context."""
    if isinstance(prompt, list):  # a conversation: its last user message, after its system message and turns
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        if not users:
            raise NoExamples("the conversation has no user message to send")
        before, system = prompt[: users[-1]], ""
        if before and before[0].get("role") == "system":
            system, before = str(before[0]["content"]), before[1:]
        context = {"prompt": str(prompt[users[-1]]["content"]), "system": system}
        if [m.get("role") for m in before] != ["user", "assistant"] * (len(before) // 2):
            return {**context, "left_out": len(before)}  # tool calls, two users in a row ...: not turns
        pairs = zip(before[::2], before[1::2], strict=True)
        return {**context, "turns": tuple((str(u["content"]), str(a["content"])) for u, a in pairs)}
    text = str(prompt)
    if text.startswith(_ALPACA_HEAD) and text.endswith(_ALPACA_TAIL):  # alpaca: the template wraps it again
        return {"prompt": text[len(_ALPACA_HEAD) : len(text) - len(_ALPACA_TAIL)]}
    return {"prompt": text}


def data_examples(run_dir: Path, job: JobSpec) -> tuple[list[tuple[object, str]], str, bool]:
    """(the (prompt, answer) pairs of the run's first data rows, their source, held out?)."""
    try:
        rows, source = eval_rows(run_dir, job, limit=ROWS_READ)
        held_out = True
    except NoEvalData:
        rows, source = training_rows(run_dir, job, limit=ROWS_READ)
        held_out = False
    prompts = [qa for qa in map(question_and_answer, rows) if qa is not None]
    if not prompts:
        raise NoExamples(
            f"the run's data ({Path(source).name}) is plain text, with no prompt and answer to take: type a prompt"
        )
    pairs = [(prompt, expected) for prompt, expected in prompts if expected is not None]
    if not pairs:
        raise NoExamples(f"the run's data ({Path(source).name}) has prompts without answers: type a prompt")
    return pairs, source, held_out


def shared_system_message(run_dir: Path, job: JobSpec) -> str:
    """The system message every conversation of the run's first training rows opens with, or "" when they have
    none or several (or the data cannot be read now): what the model learned to answer under, which a server should
    send when a user gives none."""
    try:
        rows, _ = training_rows(run_dir, job, limit=ROWS_READ)
    except (AfterError, OSError):
        return ""
    systems = set()
    for found in map(question_and_answer, rows):
        if found is None or not isinstance(found[0], list):
            return ""
        try:
            systems.add(typed(found[0])["system"])
        except NoExamples:
            return ""
    return systems.pop() if len(systems) == 1 else ""


def pick(pairs: list[tuple[object, str]], source: str, held_out: bool, number: int | None = None) -> Example:
    """Example `number` (1-based), or one at random."""
    if number is None:
        number = random.randrange(len(pairs)) + 1
    if not 1 <= number <= len(pairs):
        raise NoExamples(f"example: {number} is not between 1 and {len(pairs)} (the rows with an answer)")
    prompt, expected = pairs[number - 1]
    return Example(
        expected=expected, number=number, count=len(pairs), source=source, held_out=held_out, **typed(prompt)
    )


def verdict(answer: str, expected: str) -> str:
    """The answer against the data's, as evaluation scores it (exact match, contains match, ROUGE-L)."""
    if exact_match(answer, expected):
        return "✓ the data's answer"
    close = f" (ROUGE-L {rouge_l(answer, expected):.2f})"
    if expected.strip() and contains_match(answer, expected):
        return "✓ contains the data's answer" + close
    return "✗ not the data's answer" + close
