"""What a GRPO run's model writes: the last record of its answers.jsonl (train.py's write_answers), for people.

At each logging step rank 0 appends the answers the model just wrote to two prompts, each with its rewards and
advantage (how far above or below its group's mean it scored: what GRPO pushes it toward or away from). The Run
tab shows the newest record under the charts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tunedeck.backend.recipe import ANSWERS_FILE, last_record

TAIL_BYTES = 512 * 1024  # a record holds at most 2 prompts x their answers x 2,000 characters each
SHOWN_CHARS = 300  # of an answer in the table (the file keeps 2,000)


def latest_answers(run_dir: Path) -> dict | None:
    """The newest complete record of answers.jsonl, or None (no GRPO run, or none written yet)."""
    return last_record(Path(run_dir) / ANSWERS_FILE, lambda record: isinstance(record.get("groups"), list), TAIL_BYTES)


def _cell(text: str, as_text: Callable[[str], str]) -> str:
    shown = " ".join(str(text).split())
    shown = shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "…"
    return as_text(shown) or "(nothing)"


def _number(value) -> str:
    return f"{value:+.2f}" if isinstance(value, int | float) else "–"


def _advantage(answer: dict) -> float:
    value = answer.get("advantage")
    return value if isinstance(value, int | float) else 0.0


def answers_markdown(record: dict | None, as_text: Callable[[str], str]) -> str:
    """The record as markdown: each prompt, then a table of its answers (best first; the same answer written again
    counted, not repeated) with each reward and the advantage; '' without a record. `as_text` shows the model's
    answers and the rewards' names as text (the page's app/untrusted_text.py: no link, image or HTML of theirs)."""
    if not record or not record.get("groups"):
        return ""
    lines = [
        f"#### What the model writes (step {as_text(str(record.get('step')))})",
        "The answers of the last logging step to two prompts, best first, each reward's score and its advantage "
        "(above 0: made more likely).",
    ]
    for group in record["groups"]:
        answers = [a for a in group.get("answers", []) if isinstance(a, dict)]
        names = list(dict.fromkeys(name for a in answers for name in (a.get("rewards") or {})))
        written: dict[str, tuple[dict, int]] = {}
        for a in answers:
            first, times = written.get(str(a.get("text", "")), (a, 0))
            written[str(a.get("text", ""))] = (first, times + 1)
        ranked = sorted(written.values(), key=lambda at: -_advantage(at[0]))
        prompt = str(group.get("prompt", ""))
        fence = "~~~~" if "```" in prompt else "```"
        lines += ["", fence, prompt.replace(fence, ""), fence, ""]
        header = f"| answer | written | {' | '.join(as_text(' '.join(str(n).split())) for n in names)} | advantage |"
        lines += [header, "|---" * (len(names) + 3) + "|"]
        for a, times in ranked:
            scores = " | ".join(_number((a.get("rewards") or {}).get(n)).lstrip("+") for n in names)
            lines.append(
                f"| {_cell(a.get('text', ''), as_text)} | ×{times} | {scores} | {_number(a.get('advantage'))} |"
            )
    return "\n".join(lines)
