"""Standard benchmarks: lm-evaluation-harness tasks (`lm_eval.simple_evaluate`) on each model an evaluation loads.

The tasks are those on this machine: the project's own folder (assets/eval: demo_arith, the demo's held-out
arithmetic questions, offline), a folder of the user's task YAMLs (`--task-dir`, lm-evaluation-harness's
include_path), and lm-evaluation-harness's own tasks, whose data come from the Hugging Face Hub where it is
reachable (or its cache). Each runs on its first `limit` questions (DEFAULT_LIMIT, a quick slice) or, with no
limit, all of them. The names are checked and each task's data loaded before a model loads, so a wrong name or
an unreachable Hub costs seconds, not a model load. Imports lm_eval inside its functions: worker process only
(`parse_tasks` and `check_task_dir` are plain and serve the CLI and the page).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tunedeck.backend.after.eval_data import EvalDataError
from tunedeck.backend.spec import PACKAGE_DIR

TASKS_DIR = PACKAGE_DIR / "assets" / "eval"
DEFAULT_LIMIT = 20  # questions per task unless the full task is asked for: a slice that runs in seconds
BATCH_SIZE = 8


@dataclass(frozen=True)
class Benchmarks:
    """Which tasks, on how many questions each (None: all), and a folder of the user's own task YAMLs."""

    tasks: tuple[str, ...]
    limit: int | None = DEFAULT_LIMIT
    task_dir: str | None = None

    @classmethod
    def from_args(cls, args: dict) -> Benchmarks | None:
        tasks = tuple(args.get("tasks") or ())
        return cls(tasks, args.get("tasks_limit"), args.get("task_dir")) if tasks else None


def _refused(cli: str, page: str) -> EvalDataError:
    return EvalDataError({"cli": cli, "page": page})


def parse_tasks(text: str | None) -> tuple[str, ...]:
    """Task names from "demo_arith, hellaswag" (commas or spaces), each once, in order."""
    return tuple(dict.fromkeys((text or "").replace(",", " ").split()))


def check_task_dir(task_dir: str | None) -> str | None:
    """The folder of task YAMLs, resolved; an error naming --task-dir when it is not a folder."""
    if not task_dir:
        return None
    folder = Path(task_dir).expanduser()
    if not folder.is_dir():
        raise _refused(
            f"--task-dir: {task_dir} is not a folder; give a folder of lm-evaluation-harness task YAML files",
            f"Benchmarks: the task folder {task_dir} is not there",
        )
    return str(folder.resolve())


def task_manager(benchmarks: Benchmarks):
    """An lm_eval TaskManager that knows every named task: the local folders alone when they have them all (the
    harness's own ~15,000 take about 10 s to index), else those too; an error naming --tasks for an unknown one."""
    from lm_eval.tasks import TaskManager

    folders: list[str | Path] = [TASKS_DIR, *filter(None, [check_task_dir(benchmarks.task_dir)])]
    manager = TaskManager(include_path=folders, include_defaults=False)
    if not set(benchmarks.tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=folders)
    unknown = [name for name in benchmarks.tasks if name not in manager.all_tasks]
    if unknown:
        local = ", ".join(TaskManager(include_path=folders, include_defaults=False).all_tasks)
        raise _refused(
            f"--tasks: no task named {unknown[0]!r} on this machine (local: {local}; or one of lm-evaluation-harness's "
            "own, e.g. hellaswag, arc_easy, gsm8k); fix the name, or give its folder of task YAMLs with --task-dir",
            f"Benchmarks: no task named {unknown[0]!r} on this machine; local tasks: {local}, or one of "
            "lm-evaluation-harness's own (e.g. hellaswag, arc_easy)",
        )
    return manager


def load_tasks(benchmarks: Benchmarks, manager) -> None:
    """Load each task's questions once (datasets caches them) so an unreachable Hub is said before a model loads."""
    from lm_eval.tasks import get_task_dict

    for name in benchmarks.tasks:
        try:
            get_task_dict([name], manager)
        except Exception as exc:  # noqa: BLE001 - datasets and the Hub raise many kinds: each is one line for the user
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _refused(
                f"--tasks: the questions of {name} cannot be loaded ({why[:300]}); lm-evaluation-harness's own tasks "
                "need the Hugging Face Hub (or its cache): run where it is reachable, or use a local task (--task-dir)",
                f"Benchmarks: the questions of {name} cannot be loaded ({why[:200]}); the harness's own tasks need the "
                "Hugging Face Hub",
            ) from None


def harness_scores(model, tokenizer, benchmarks: Benchmarks, manager, chat: bool, say, check_cancel) -> dict:
    """{task: {metric, score, scores, samples, of, limit}} of one model; `chat`: prompts through its chat template;
    `check_cancel` raises when the caller asked to stop (between tasks)."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    # HFLM's registry decorator hides its signature from a type checker; the keywords are its __init__'s.
    lm = cast(Any, HFLM)(pretrained=model, tokenizer=tokenizer, batch_size=BATCH_SIZE)
    out = {}
    for index, name in enumerate(benchmarks.tasks):
        check_cancel()
        say(index, len(benchmarks.tasks))
        result = simple_evaluate(
            model=lm,
            tasks=[name],
            task_manager=manager,
            limit=benchmarks.limit,
            log_samples=False,
            bootstrap_iters=0,  # no stderr: a slice's is not worth the minutes it takes
            apply_chat_template=chat,
        )
        assert result is not None  # None only on ranks other than 0 of a distributed evaluation
        out[name] = task_result(dict(result), name, benchmarks.limit)
    say(len(benchmarks.tasks), len(benchmarks.tasks))
    return out


def task_result(result: dict, name: str, limit: int | None) -> dict:
    """The named task's (or group's) scores in simple_evaluate's result: its first metric is the one shown."""
    row = result.get("groups", {}).get(name) or result["results"][name]
    scores = {
        key.split(",")[0]: float(value)
        for key, value in row.items()
        if "," in key and "_stderr" not in key and isinstance(value, int | float) and math.isfinite(value)
    }
    if not scores:
        raise EvalDataError({"cli": f"--tasks: {name} gave no score", "page": f"Benchmarks: {name} gave no score"})
    metric = next(iter(scores))
    samples = result.get("n-samples", {}).get(name, {})
    return {
        "metric": metric,
        "score": scores[metric],
        "scores": scores,
        "samples": samples.get("effective"),
        "of": samples.get("original"),
        "limit": limit,
    }
