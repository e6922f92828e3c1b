"""train.py's metrics records, driven through its real callback with a stepped clock (no training needed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tunedeck.backend import recipe


def test_evaluation_time_is_left_out_of_tokens_per_second(tmp_path, monkeypatch):
    from transformers import TrainerControl

    clock = [1000.0]
    monkeypatch.setattr(recipe.recorder, "time", SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0]))
    recorder = recipe.make_callback(recipe.JsonlWriter(tmp_path / "metrics.jsonl"), recipe.StopRequest(), {}, None)
    args, control = SimpleNamespace(device="cpu"), TrainerControl()
    state = SimpleNamespace(global_step=0, max_steps=10, epoch=0.0)

    def step(seconds: float, tokens: int | None = None) -> None:
        """One optimizer step of `seconds`; with `tokens` (the running total) it is a logging step."""
        clock[0] += seconds
        state.global_step += 1
        recorder.on_step_end(args, state, control)
        if tokens is not None:
            recorder.on_log(args, state, control, logs={"loss": 1.0, "num_tokens": tokens})

    def evaluate(seconds: float) -> None:
        clock[0] += seconds
        recorder.on_log(args, state, control, logs={"eval_loss": 1.0})

    step(1, 1000)
    step(1, 2000)
    evaluate(10)  # right after a logging step
    step(1, 3000)
    step(1)
    evaluate(10)  # after a step that was not logged
    step(1)
    step(1, 6000)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    throughput = [r["tokens_per_second"] for r in records if "loss" in r]
    assert throughput == [1000.0, 1000.0, 1000.0, 1000.0]  # 1000 tokens per training second throughout
    assert [r["step"] for r in records if "eval_loss" in r] == [2, 4]
    # The ETA's pace counts the evaluations: they come back until the end. 25 s from step 1 to step 6.
    assert records[-1]["seconds_per_step"] == 5.0 and "seconds_per_step" not in records[0]
