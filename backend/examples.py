"""Examples to try a run with: a prompt from its data, typed as the Try box wraps it, and the data's answer.

The prompt is what the Try box sends through the run's template (prompting.resolve_template):
prompt-completion rows as they are, an alpaca row as its instruction (and input) so that
wrapping it again gives back the prompt the model trained on, a conversation as its last user
message. Held-out rows (the run's evaluation data) come first; without any, the training rows,
which the model has seen. A plain-text dataset has no prompt and answer to split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.checkpoints import AfterError
from tunedeck.backend.evaluate import (
    NoEvalData,
    contains_match,
    eval_rows,
    exact_match,
    question_and_answer,
    training_rows,
)
from tunedeck.backend.train import ALPACA_PROMPT

ROWS_READ = 500  # the examples are drawn from the first rows of the data
_ALPACA_HEAD, _ALPACA_TAIL = ALPACA_PROMPT.split("{instruction}")


class NoExamples(AfterError):
    """The run's data has no prompt and answer to take."""


@dataclass(frozen=True)
class Example:
    prompt: str  # the text to type
    expected: str  # the data's answer
    number: int  # 1-based, among the rows with an answer
    count: int
    source: str
    held_out: bool
    left_out: int = 0  # messages before the last user one (system, earlier turns) the Try box does not send

    def describe(self) -> str:
        kind = "held-out row" if self.held_out else "training row (the model has seen it)"
        where = Path(self.source).name or self.source
        dropped = f" · its {self.left_out} earlier message{'s' * (self.left_out > 1)} not sent" if self.left_out else ""
        return f"example {self.number} of {self.count}, a {kind} of {where}{dropped}"


def typed(prompt: object) -> tuple[str, int]:
    """(the text to type for a row's prompt, how many messages before it are left out)."""
    if isinstance(prompt, list):  # a conversation: its last user message, with the chat template
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        if not users:
            raise NoExamples("the conversation has no user message to send")
        return str(prompt[users[-1]]["content"]), users[-1]
    text = str(prompt)
    if text.startswith(_ALPACA_HEAD) and text.endswith(_ALPACA_TAIL):  # alpaca: the template wraps it again
        return text[len(_ALPACA_HEAD) : len(text) - len(_ALPACA_TAIL)], 0
    return text, 0


def data_examples(run_dir: Path, job: dict) -> tuple[list[tuple[object, str]], str, bool]:
    """(the (prompt, answer) pairs of the run's first data rows, their source, held out?)."""
    try:
        rows, source = eval_rows(run_dir, job, limit=ROWS_READ)
        held_out = True
    except NoEvalData:
        rows, source = training_rows(run_dir, job, limit=ROWS_READ)
        held_out = False
    pairs = [qa for qa in map(question_and_answer, rows) if qa is not None]
    if not pairs:
        raise NoExamples(
            f"the run's data ({Path(source).name}) is plain text, with no prompt and answer to take: type a prompt"
        )
    return pairs, source, held_out


def pick(pairs: list[tuple[object, str]], source: str, held_out: bool, number: int | None = None) -> Example:
    """Example `number` (1-based), or one at random."""
    if number is None:
        number = random.randrange(len(pairs)) + 1
    if not 1 <= number <= len(pairs):
        raise NoExamples(f"example: {number} is not between 1 and {len(pairs)} (the rows with an answer)")
    prompt, expected = pairs[number - 1]
    text, left_out = typed(prompt)
    return Example(text, expected, number, len(pairs), source, held_out, left_out)


def verdict(answer: str, expected: str) -> str:
    """The answer against the data's, as evaluation scores it (exact match, contains match)."""
    if exact_match(answer, expected):
        return "✓ the data's answer"
    if expected.strip() and contains_match(answer, expected):
        return "✓ contains the data's answer"
    return "✗ not the data's answer"
