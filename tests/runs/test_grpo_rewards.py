"""GRPO rewards that lie, without training: what a reward returns is checked as TRL calls it, a reward that scores
none of a step's answers is a warning in the run's state line, and a reward module that hangs at import is a stall
(tests/runs/test_grpo.py runs them for real)."""

from __future__ import annotations

import inspect
import json
import math
import time

import numpy as np
import pytest
import torch

from tunedeck.backend import recipe
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.status import from_status_file

CALL = {  # how TRL calls a reward: its columns by name, two answers to one prompt here
    "prompts": ["Q: 2+2?", "Q: 2+2?"],
    "completions": ["4", "five"],
    "completion_ids": [[1], [2]],
    "answer": ["4", "4"],
    "trainer_state": None,
}


@pytest.fixture
def liar(tmp_path):
    """grpo.rewards = [exact_answer, FILE:liar, FILE:later]: liar returns its column `returned` as it is; later is
    async. (path, exact_answer, a call of liar returning a value, later), each as reward_functions gives it."""
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def liar(completions, returned, **columns):\n"
        "    return returned\n"
        "async def later(completions, **columns):\n"
        "    return [0.5 for _ in completions]\n",
        encoding="utf-8",
    )
    rewards = ["exact_answer", f"{path}:liar", f"{path}:later"]
    exact, lying, later = recipe.reward_functions({"grpo": {"rewards": rewards}})
    return path, exact, lambda returned: lying(**CALL, returned=returned), later


def test_what_a_reward_returns_is_checked_and_a_bad_answer_names_the_reward_and_what_it_returned(liar):
    path, exact, calls, later = liar
    name = f"the reward liar (grpo.rewards[1]: {path}:liar)"
    wrong = {
        None: f"{name} returned None for 2 answers: a reward returns a list of one number per answer",
        0.5: f"{name} returned a float 0.5 for 2 answers: a reward returns a list",
        "1": f"{name} returned a str '1' for 2 answers: a reward returns a list",
        (1.0,): f"{name} returned 1 scores for 2 answers: one number per answer",
        (
            "1",
            0.0,
        ): f"{name} returned a str '1' for answer 1 of 2 (prompt 'Q: 2+2?', answer '4'): each score is a number",
        (1.0, math.nan): f"{name} returned a float nan for answer 2 of 2 (prompt 'Q: 2+2?', answer 'five'): a score "
        "must be a finite number",
        (math.inf, 0.0): f"{name} returned a float inf for answer 1 of 2",
    }
    for returned, message in wrong.items():
        with pytest.raises(recipe.RewardError) as raised:
            calls(list(returned) if isinstance(returned, tuple) else returned)
        assert str(raised.value).startswith(message), (returned, str(raised.value))
    # What TRL itself takes stays as it is: None where a reward does not apply, numpy and torch scores, bools
    assert calls([None, 1.0]) == [None, 1.0] and calls([None, None]) == [None, None]
    assert calls(np.array([0.5, 1.0])) == [0.5, 1.0] and calls(torch.tensor([1.0, 0.0])) == [1.0, 0.0]
    assert calls([np.float32(0.5), True]) == [np.float32(0.5), True]
    assert exact(**CALL) == [1.0, 0.0] and exact.__name__ == "exact_answer"  # TRL names each reward by __name__
    assert later.__name__ == "later" and inspect.iscoroutinefunction(later)  # TRL awaits an async reward


def test_a_reward_that_scores_none_of_a_steps_answers_is_a_warning_that_names_it():
    scores = torch.tensor([[1.0, math.nan, 0.2], [0.0, math.nan, math.nan], [1.0, math.nan, 0.4]])  # 3 answers
    assert recipe.unscored_warning(["exact_answer", "abstains", "judge"], scores, step=3) == (
        "the reward abstains (grpo.rewards[1]) scored none of the 3 answers at step 3 (None for each): GRPO learned "
        "nothing from it there"
    )
    assert recipe.unscored_warning(["exact_answer", "judge"], scores[:, [0, 2]], step=3) is None  # some None is fine


def test_the_supervisor_carries_the_runs_warning_to_its_state_line_and_marks_a_hung_reward_import_stalled(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "running"}))
    watch = supervisor.StallWatch(tmp_path, {"after_s": 10})

    def phase(name: str, began: float) -> dict:
        (tmp_path / "startup.json").write_text(json.dumps({"phases": [{"phase": name, "at": began}]}))
        watch.check(watch.checked_at + 2)
        return json.loads((tmp_path / "status.json").read_text())

    assert phase("loading the model", time.time() - 600).get("stalled") is None  # loading is not watched
    assert phase("importing the reward functions", time.time() - 5).get("stalled") is None  # within the limit
    status = phase("importing the reward functions", time.time() - 11)
    assert status["stalled"]["phase"] == "importing the reward functions"
    assert from_status_file("r", status).where == (
        "⚠ stalled: importing the reward functions for over 10 s · each rank writes its Python stack to its log "
        "(logs/rank<N>.log)"
    )
    assert phase("loading the model", time.time()).get("stalled") is None  # the import ended: no longer stalled

    warning = "the reward abstains (grpo.rewards[1]) scored none of the 64 answers at step 3 (None for each): ..."
    recipe.write_progress(tmp_path, 3, warning=warning)
    watch.check(watch.checked_at + 2)
    status = json.loads((tmp_path / "status.json").read_text())
    assert from_status_file("r", status).where == f"⚠ {warning}"
    assert from_status_file("r", {**status, "state": "finished"}).where == f"⚠ {warning}"  # it learned nothing


def test_each_ranks_watchdog_writes_its_stack_when_a_reward_module_hangs_at_import(tmp_path, capfd):
    path = tmp_path / "slow_rewards.py"
    path.write_text("import time\ntime.sleep(3.5)\ndef score(completions, **_):\n    return [0.0] * len(completions)\n")
    job = {"launch": {"stall_minutes": 0.03}, "grpo": {"rewards": [f"{path}:score"]}}  # 1.8 s
    startup = recipe.StartupPhases(tmp_path, rank=0)
    with recipe.watched_phase(job, tmp_path, startup, recipe.IMPORTING_REWARDS):
        recipe.reward_functions(job)
    dump = capfd.readouterr().err
    assert "tunedeck: stalled: importing the reward functions for 0 min on rank 0; every thread's stack:" in dump
    assert "slow_rewards.py" in dump  # the stack shows where the import waits
    assert [p["phase"] for p in json.loads((tmp_path / "startup.json").read_text())["phases"]] == [
        "importing the reward functions"
    ]
    assert not (tmp_path / "errors.jsonl").exists()  # without launch.stop_when_stalled the run goes on
