"""GRPO's rewards: the built-in ones, your own loaded from their files, each checked as TRL calls it; and the
answers the model wrote, kept in answers.jsonl for people to read.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import math
import numbers
import re
from collections.abc import Callable
from pathlib import Path

from .job import JobError
from .records import ANSWERS_FILE, JsonlWriter

# Each scores a list of written answers (TRL's completions: text, or a list of messages for chat prompts) against
# the rows' reference answers (the dataset's answer column, TRL passes every column by name). A row without a
# reference answer gets None, which TRL leaves out of the mean. tunedeck describes them in backend/recipe/vocabulary.py.

ANSWER_MARK = "####"  # GSM8K's mark before the final answer

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _answer_text(value) -> str:
    if isinstance(value, list):  # a chat completion: the messages the model wrote
        return " ".join(str(message.get("content", "")) for message in value if isinstance(message, dict))
    return "" if value is None else str(value)


def final_answer(text: str) -> str:
    """The answer a text gives: after its last '####', else inside its last \\boxed{}, else all of it; spaces
    collapsed and a closing period dropped."""
    if ANSWER_MARK in text:
        text = text.rsplit(ANSWER_MARK, 1)[1]
    elif boxed := BOXED.findall(text):
        text = boxed[-1]
    return " ".join(text.split()).rstrip(".")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _per_answer(score: Callable[[str, str], float]) -> Callable[..., list[float | None]]:
    """A reward as TRL calls it, from score(final answer, reference's final answer); None for a row without one."""

    @functools.wraps(score)  # TRL names a reward by its function's name
    def reward(completions, answer=None, **_) -> list[float | None]:
        references = answer or [None] * len(completions)
        return [
            None if ref is None else score(final_answer(_answer_text(text)), final_answer(str(ref)))
            for text, ref in zip(completions, references)
        ]

    return reward


@_per_answer
def exact_answer(got: str, want: str) -> float:
    """1 when the final answer equals the reference answer (numbers compared as numbers: 4.0 is 4), else 0."""
    same = got == want or (_number(got) is not None and _number(got) == _number(want))
    return 1.0 if same else 0.0


@_per_answer
def close_answer(got: str, want: str) -> float:
    """Partial credit: a number off by d scores 1/(1+d) (a non-number 0); other answers the share of their words in
    the right place."""
    target = _number(want)
    if target is not None:
        number = _number(got)
        return 0.0 if number is None else 1.0 / (1.0 + abs(number - target))
    words, wanted = got.split(), want.split()
    return sum(a == b for a, b in zip(words, wanted)) / max(len(words), len(wanted), 1)


REWARD_FUNCTIONS = {"exact_answer": exact_answer, "close_answer": close_answer}

CUSTOM_REWARD = re.compile(r"^(?P<file>/.+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")  # as spec_grpo.py reads it


def reward_problem(entry: str) -> str | None:
    """Why a reward cannot be loaded here (a custom reward's file or function is missing), or None."""
    if entry in REWARD_FUNCTIONS:
        return None
    found = CUSTOM_REWARD.match(str(entry))
    if not found:
        return f"{entry!r} is no reward: use {' or '.join(REWARD_FUNCTIONS)}, or /path/to/FILE.py:FUNCTION"
    path, name = Path(found["file"]), found["function"]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}): the reward file must be on the machine that trains"
    except SyntaxError as exc:
        return f"{path} line {exc.lineno}: {exc.msg}; fix the reward file"
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    if name not in defined:
        return f"{path} defines no function {name!r} (it defines {', '.join(sorted(defined)) or 'none'})"
    return None


def reward_functions(job: dict) -> list:
    """The job's rewards as callables, each checked as TRL calls it (checked_reward): the built-in ones, and your own
    loaded from their files (train() imports them under the stall watchdog: a module may hang at import)."""
    functions = []
    for index, entry in enumerate((job.get("grpo") or {}).get("rewards") or ["exact_answer"]):
        if entry in REWARD_FUNCTIONS:
            functions.append(checked_reward(REWARD_FUNCTIONS[entry], f"the reward {entry} (grpo.rewards[{index}])"))
            continue
        found = CUSTOM_REWARD.match(entry)
        spec = found and importlib.util.spec_from_file_location(f"reward_{Path(found['file']).stem}", found["file"])
        if found is None or spec is None or spec.loader is None:  # validation refused such an entry before the run
            raise JobError(f"grpo.rewards[{index}]: {entry} is neither a built-in reward nor FILE.py:FUNCTION")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        name = f"the reward {found['function']} (grpo.rewards[{index}]: {entry})"
        functions.append(checked_reward(getattr(module, found["function"]), name))
    return functions


class RewardError(JobError):
    """A reward returned what GRPO cannot learn from; the message names the reward and what it returned."""


def checked_reward(function, name: str):
    """`function` as TRL calls it (prompts=, completions=, the rows' columns by name), with what it returns checked
    (check_scores): TRL turned NaN, inf and a bare number into a run that "finished" having learned nothing, and None
    or text into errors that did not say which reward. Keeps the name TRL gives the reward (trl.trainer.utils'
    get_callable_name: a function's name, a callable object's class name) and, for an async reward, its being async
    (TRL awaits those: is_async_callable)."""

    def reward(*args, **columns):
        return check_scores(function(*args, **columns), name, _by_name(args, columns))

    async def async_reward(*args, **columns):
        return check_scores(await function(*args, **columns), name, _by_name(args, columns))

    plain = function
    while isinstance(plain, functools.partial):
        plain = plain.func
    is_async = inspect.iscoroutinefunction(plain) or inspect.iscoroutinefunction(type(plain).__call__)
    checked = async_reward if is_async else reward
    checked.__name__ = checked.__qualname__ = getattr(plain, "__name__", type(plain).__name__)
    return checked


def _by_name(args: tuple, columns: dict) -> dict:
    """A reward's arguments by name: TRL passes them so; a call by position gives the answers first."""
    return {"completions": args[0], **columns} if args else columns


def check_scores(scores, name: str, columns: dict) -> list:
    """The scores a reward returned, as a list, if they are one finite number (or None: the reward does not apply)
    per answer; else RewardError naming the reward, what it returned and, for a bad score, the answer's row."""
    answers = list(columns.get("completions") or [])
    if hasattr(scores, "tolist") and not isinstance(scores, (str, bytes)):
        scores = scores.tolist()  # a numpy array or a tensor
    if not isinstance(scores, (list, tuple)):
        raise RewardError(
            f"{name} returned {_shown(scores)} for {len(answers)} answers: a reward returns a list of one number "
            "per answer (None where it does not apply)"
        )
    if len(scores) != len(answers):
        raise RewardError(
            f"{name} returned {len(scores)} scores for {len(answers)} answers: one number per answer (None where "
            "it does not apply)"
        )
    for i, score in enumerate(scores):
        if score is None:
            continue
        if not isinstance(score, numbers.Real):
            problem = "each score is a number, or None where the reward does not apply"
        elif not math.isfinite(score):
            problem = "a score must be a finite number: GRPO learns nothing from the whole step otherwise"
        else:
            continue
        raise RewardError(f"{name} returned {_shown(score)} for {_row(columns, i, len(answers))}: {problem}")
    return list(scores)


def _shown(value, limit: int = 80) -> str:
    """What a reward returned, in a few words: "None", "a str '0.5'", "a float nan"."""
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "None" if value is None else f"a {type(value).__name__} {text}"


def _row(columns: dict, i: int, count: int, limit: int = 60) -> str:
    """Which answer: 'answer 3 of 8 (prompt 'Q: 2+2?', answer '5')'."""
    parts = []
    for column, label in (("prompts", "prompt"), ("completions", "answer")):
        values = columns.get(column) or []
        if i < len(values):
            text = _answer_text(values[i])
            parts.append(f"{label} {(text if len(text) <= limit else text[: limit - 3] + '...')!r}")
    return f"answer {i + 1} of {count}" + (f" ({', '.join(parts)})" if parts else "")


def unscored_warning(names: list[str], rewards, step: int) -> str | None:
    """A warning naming each reward that scored none of a step's answers, from GRPOTrainer's rewards of every rank
    (a row per answer, a column per reward; None is NaN there); None when each scored some. TRL leaves None out of
    the mean, which is right for a row a reward does not apply to, but a reward with nothing to say for a whole step
    gives GRPO nothing to learn from it, and TRL only warns when every reward is None for an answer."""
    silent = [f"{name} (grpo.rewards[{i}])" for i, name in enumerate(names) if bool(rewards[:, i].isnan().all())]
    if not silent:
        return None
    one = len(silent) == 1
    return (
        f"{'the reward' if one else 'the rewards'} {', '.join(silent)} scored none of the {len(rewards)} answers at "
        f"step {step} (None for each): GRPO learned nothing from {'it' if one else 'them'} there"
    )


ANSWER_GROUPS, ANSWER_CHARS = 2, 2000  # prompts kept a logging step; characters kept of a prompt or an answer


def write_answers(run_dir: Path, step: int, latest: dict | None) -> None:
    """Append the answers GRPOTrainer last wrote to the first ANSWER_GROUPS prompts (its `_logs`: the last
    generation batch of every rank, in order), each with its rewards and advantage, to answers.jsonl."""
    if not latest or not latest.get("prompt"):
        return
    rewards = {name: list(values) for name, values in latest.get("rewards", {}).items()}
    advantages = list(latest.get("advantages", []))
    groups: dict[str, list] = {}
    for i, (prompt, answer) in enumerate(zip(latest["prompt"], latest["completion"])):
        key = _answer_text(prompt)
        if key not in groups and len(groups) == ANSWER_GROUPS:
            break
        groups.setdefault(key, []).append(
            {
                "text": _answer_text(answer)[:ANSWER_CHARS],
                "rewards": {name: values[i] for name, values in rewards.items() if i < len(values)},
                "advantage": advantages[i] if i < len(advantages) else None,
            }
        )
    record = {"step": step, "groups": [{"prompt": p[:ANSWER_CHARS], "answers": a} for p, a in groups.items()]}
    JsonlWriter(run_dir / ANSWERS_FILE).write(record)
