"""The forgetting check: each model's loss on a small fixed sample of general text, and the adapter's rise over the
base's (as PEFT measures forgetting: the loss on a general-text slice before and after fine-tuning).

The sample: a plain-text file the user names (`tunedeck eval --general-text FILE`, the page's upload), else the
built-in one, assets/eval/general-text.txt (about 6 KB of everyday English prose written for tunedeck, under the
project's Apache-2.0 license). The text is tokenized whole and cut into blocks of the run's dataset.max_seq_length
tokens (the length it trained at); the loss is the mean over every token after the first of each block.
A rise of more than RISE_FLAGGED of the base's loss is flagged with its size. No torch at import: the loss itself
is computed in the worker (backend/after/evaluate.py: Checks).
"""

from __future__ import annotations

import math
from pathlib import Path

from tunedeck.backend.after.eval_data import EvalDataError
from tunedeck.backend.recipe.general_text import BUILTIN as BUILTIN_NAME  # what the page and the CLI pass for it
from tunedeck.backend.recipe.general_text import RISE_FLAGGED
from tunedeck.backend.spec import GENERAL_TEXT_SAMPLE as BUILTIN


def read_general_text(path: str | None) -> tuple[str, str]:
    """(the text, where it comes from) of a plain-text file, or of the built-in sample for None or BUILTIN_NAME."""
    if path in (None, "", BUILTIN_NAME):
        return BUILTIN.read_text(encoding="utf-8"), BUILTIN_NAME
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _unreadable(file, f"cannot be read ({why})") from None
    if not text.strip():
        raise _unreadable(file, "holds no text")
    return text, str(file.resolve())


def _unreadable(file: Path, what: str) -> EvalDataError:
    return EvalDataError(
        {
            "cli": f"--general-text: {file} {what}; give a plain-text (UTF-8) file of general prose, or leave the "
            "flag out for the built-in sample",
            "page": f"General text: {file.name} {what}; upload a plain-text (UTF-8) file of general prose, or "
            "clear the box for the built-in sample",
        }
    )


def mean_text_loss(losses: list[tuple[float, int]]) -> dict:
    """{loss, perplexity, tokens} from each block's (summed loss, tokens)."""
    tokens = sum(n for _, n in losses)
    loss = sum(total for total, _ in losses) / tokens
    return {"loss": loss, "perplexity": math.exp(min(loss, 700)), "tokens": tokens}


def forgetting_lines(results: dict) -> list[str]:
    """One line per adapter measured on the same general text as the base: its loss against the base's, flagged
    when it rose more than RISE_FLAGGED ("general-text loss rose 0.42 (3.10 → 3.52, +14%): ...")."""
    from tunedeck.backend.after.scoring import order_key

    base = (results.get("base") or {}).get("general_text")
    if not base:
        return []
    lines = []
    for name in sorted(results, key=order_key):
        mine = results[name].get("general_text")
        if name == "base" or not mine or mine.get("source") != base.get("source"):
            continue
        rise, before, after = mine["loss"] - base["loss"], base["loss"], mine["loss"]
        share = rise / before if before else 0.0
        figures = f"({before:.2f} → {after:.2f}, {share:+.0%})"
        if share > RISE_FLAGGED:
            lines.append(
                f"⚠ {name}: general-text loss rose {rise:.2f} {figures}: the adapter forgot some general language"
            )
        else:
            lines.append(
                f"{name}: general-text loss {figures}: no sign of forgetting (flagged above +{RISE_FLAGGED:.0%})"
            )
    return lines
