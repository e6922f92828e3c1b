"""The callback that records the run: the start record (what it got, the gate's verdict, MFU's inputs), a log
record per logging step, progress.json as steps end, a stop request turned into save-and-stop.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from .describe import describe_run, gpu_peaks_gb
from .gate import gate_error, shared_gate_problems
from .health_actions import HealthActions
from .objectives import grpo_record, objective_record
from .ranks import _any_rank, _world_size, global_rank
from .records import FAULT_ENV, JsonlWriter, StartupPhases, StopRequest, _parse_fault, write_progress
from .restore import restored
from .rewards import write_answers
from .rollback import current_rollback, scale_learning_rate
from .speed import speed_facts, utilisation
from .watchdog import FORWARDS_TOLD_EVERY_S, StallWatchdog


def make_callback(metrics: JsonlWriter | None, stop: StopRequest, job: dict, terminal, expected: dict | None = None):
    from transformers import TrainerCallback

    class RunRecorder(TrainerCallback):
        """Writes the start/log records and turns a stop request into save-and-stop at a step boundary."""

        def __init__(self):
            self.trainer: Any = None  # the Trainer, once train() has built it
            self.load_peaks: dict = {}  # train() fills it in right after the model loaded
            self.dataset_rows: dict = {}  # and this: the training rows each source gave (dataset.path, dataset.mix)
            self.network: dict | None = None  # and this: the all-reduce sweep before the model loaded (network.py)
            self.rank_timing: Any = None  # and this: each rank's own part of a step (rank_timing.py)
            self.source_losses: Any = None  # and this, in a mixed run: each source's loss (source_loss.py)
            self.resumed: tuple[str | None, int | None] = (None, None)  # (checkpoint, the DP size it was saved on)
            self.stopped_early = False
            # Durations on the monotonic clock: a step of the wall clock (NTP, a VM resumed) must not bend them.
            self._last_log = (time.monotonic(), 0)
            self._last_step = 0
            self._first_log: tuple[float, int] | None = None  # (clock, step) of this process's first log record
            self.speed: dict = {}  # speed_facts, at the start of training
            self._per_sequence = 1  # GPUs sharing each sequence (Ulysses), from the start record
            self._step_end = 0.0
            self._fault = _parse_fault(os.environ.get(FAULT_ENV))
            self.watchdog = StallWatchdog(job, Path.cwd())  # train() works in the run folder
            self._micro = 0  # micro-batches done by this process
            self._forwards, self._forwards_told = 0, 0.0  # forward passes, and when progress.json last said so
            self._step = 0
            self.startup = StartupPhases(Path.cwd(), rank=-1)  # train() gives rank 0's; this one writes nothing
            self.health = HealthActions(job, metrics, terminal)

        def _progress(self, step: int, saving: bool = False) -> None:
            self._step = step
            if metrics:  # about 0.1 ms a step, so the step a stalled run stopped at is exact
                warning = getattr(self.trainer, "reward_warning", None)  # GRPO: a reward that scored nothing
                with contextlib.suppress(OSError):  # a full disk must not stop training for this
                    write_progress(metrics.path.parent, step, saving, self._micro, self._forwards, warning)

        def forward_done(self) -> None:
            """A forward pass of the model (a hook on its input embeddings): progress inside a micro-batch, where
            GRPO writes its answers a token a pass. Told to progress.json at most every few seconds."""
            self._forwards += 1
            self.watchdog.beat()
            if time.monotonic() - self._forwards_told >= FORWARDS_TOLD_EVERY_S:
                self._forwards_told = time.monotonic()
                self._progress(self._step)

        def on_substep_end(self, args, state, control, **kwargs):
            if self.rank_timing:
                self.rank_timing.micro_batch_done()
            self._micro += 1  # a micro-batch of gradient accumulation: a long step is progress as they come
            self._progress(state.global_step)
            self.watchdog.beat()

        def on_train_begin(self, args, state, control, **kwargs):
            self._last_log, self._last_step = (time.monotonic(), 0), state.global_step
            record = {**describe_run(self.trainer, job), **self.load_peaks}
            record["dataset_rows"] = self.dataset_rows
            record["network"] = self.network
            optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
            record["restored"] = restored(self.trainer, optimizer, scheduler, *self.resumed)  # before a roll-back
            self.health = HealthActions(job, metrics, terminal, state.global_step)
            rollback = current_rollback()
            if rollback:  # this attempt continues a roll-back: the learning rate it scales, the data it skipped
                scale = float(rollback.get("lr_scale", 1.0))
                scale_learning_rate(optimizer, scheduler, args.learning_rate, scale)
                record["rollback"] = {
                    "rollbacks": rollback.get("rollbacks"),
                    "checkpoint_step": rollback.get("checkpoint_step"),
                    "bad_step": rollback.get("bad_step"),
                    "lr_scale": scale,
                    "skipped_steps": getattr(self.trainer, "skipped_steps", 0),
                }
            self._per_sequence = record["sequence_parallel"]
            self.speed = speed_facts(
                self.trainer, record["trainable_params"], record["total_params"], record["objective"]
            )
            record.update(self.speed)
            problems = shared_gate_problems(expected, record) if expected else []
            record["gate"] = {"passed": not problems, "problems": problems}
            if metrics:
                metrics.write(record)
            if problems:
                raise gate_error(problems)  # on every rank: the run stops before its first step
            self.startup.enter("the first step")
            self._progress(state.global_step)
            self.watchdog.start(state.global_step)
            self._inject_fault(state.global_step)

        def on_prediction_step(self, args, state, control, **kwargs):
            self.watchdog.beat()  # an evaluation batch is progress too

        def on_evaluate(self, args, state, control, **kwargs):
            if self.rank_timing:  # the evaluation's time is no wait for the next training batch
                self.rank_timing.micro_batch_done()

        def on_save(self, args, state, control, **kwargs):
            self.watchdog.saved()
            self._progress(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            self.watchdog.done.set()
            self._progress(state.global_step, saving=True)  # the final model's save follows: no stall either

        def on_step_end(self, args, state, control, **kwargs):
            if self.rank_timing:
                self.rank_timing.micro_batch_done()
            self._step_end = time.monotonic()  # evaluation, when due, runs after this
            self.startup.enter("training")  # once: the list closes with it
            self._micro += 1
            self._progress(state.global_step)
            self.watchdog.beat(state.global_step)
            self._inject_fault(state.global_step)
            # Ranks get the signal at slightly different moments: agree, or one rank would wait forever.
            if _any_rank(stop.requested, args.device):
                if state.global_step < state.max_steps:
                    self.stopped_early = True
                control.should_save = True
                control.should_log = True
                control.should_training_stop = True
            return control

        def _inject_fault(self, step: int) -> None:
            """TUNEDECK_FAULT's failure, when it names this rank and step (see _parse_fault)."""
            rank, at, exit_code = self._fault or (None, None, None)
            if at != step or rank not in ("*", str(global_rank())):
                return
            if exit_code is not None:
                print(
                    f"fault injected by {FAULT_ENV}: os._exit({exit_code}) at step {step}", file=sys.stderr, flush=True
                )
                os._exit(exit_code)  # no end record, no error: as a library or a reward calling os._exit would
            raise RuntimeError(f"fault injected by {FAULT_ENV} on rank {global_rank()} at step {step}")

        def _pace(self, step: int) -> dict:
            """Seconds a step from this process's first log record on, for the readers' ETA (their wall-clock
            "time" fields may go backwards); a requeued job's new process starts its own count."""
            now = time.monotonic()
            if self._first_log is None:
                self._first_log = (now, step)
            since, first_step = self._first_log
            return {"seconds_per_step": (now - since) / (step - first_step)} if step > first_step else {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if "loss" not in logs and "eval_loss" not in logs:
                return  # the trainer's closing summary; the end record covers it
            peaks = gpu_peaks_gb()  # collective: every rank takes part
            ranks = self.rank_timing.gathered() if self.rank_timing and "loss" in logs else None  # collective too
            mode = "train" if "loss" in logs else "eval"
            by_source = self.source_losses.gathered(mode, args.device) if self.source_losses else None  # collective
            if metrics:
                self._write_log(args, state, logs, peaks, ranks, by_source)
            if "loss" in logs:  # after the log record: the chart shows the step that set it off
                self.health.on_log(args, state, control, logs)  # collective too

        def _write_log(self, args, state, logs: dict, peaks, ranks: list[dict] | None, by_source=None) -> None:
            """Rank 0: the log record of this logging step."""
            if not metrics:
                return
            record = {"event": "log", "time": time.time(), "step": state.global_step, "max_steps": state.max_steps}
            record["epoch"] = logs.get("epoch", state.epoch)
            record.update(self._pace(state.global_step))
            if "loss" in logs:
                now, tokens = time.monotonic(), logs.get("num_tokens")
                last_time, last_tokens = self._last_log
                if tokens is not None and now > last_time:
                    record["tokens_per_second"] = (tokens - last_tokens) / (now - last_time)
                    if self.speed.get("peak_tflops"):
                        rows = (state.global_step - self._last_step) * args.per_device_train_batch_size
                        # the GPUs sharing a sequence (Ulysses) read their rows together
                        rows *= args.gradient_accumulation_steps * _world_size() // self._per_sequence
                        rows *= self.speed["flops_inputs"].get("sequences_per_row", 1)  # DPO: two a row
                        seq_len = (tokens - last_tokens) / max(1, rows)  # attention's FLOPs grow with it
                        record.update(utilisation(self.speed, record["tokens_per_second"], seq_len))
                    self._last_log, self._last_step = (now, tokens), state.global_step
                for key in ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "num_tokens"):
                    if key in logs:
                        record[key] = logs[key]
            else:
                # Evaluation trains no tokens: leave its time out of the next tokens/s window.
                last_time, last_tokens = self._last_log
                self._last_log = (last_time + time.monotonic() - max(self._step_end, last_time), last_tokens)
            for key in ("eval_loss", "eval_mean_token_accuracy", "eval_general_text_loss"):  # the last: general_text.py
                if key in logs:
                    record[key] = logs[key]
            record.update(objective_record(job.get("objective"), logs))  # rewards, KL, ORPO's odds ratio, GRPO's
            record.update(grpo_record(logs))  # GRPO: each reward's mean
            if peaks:
                record["gpu_peak_allocated_gb"], record["gpu_peak_reserved_gb"] = peaks
            if ranks:
                record["ranks"] = ranks  # each rank's batch wait and forward time since the last log
            if by_source and "loss" in logs:  # each dataset.mix source's mean token loss since the last log record
                record["loss_by_source"] = by_source
            elif by_source:  # and of its held-out rows, at an evaluation
                record["eval_loss_by_source"] = by_source
            metrics.write(record)
            if "reward" in record:
                write_answers(Path(metrics.path).parent, state.global_step, getattr(self.trainer, "_logs", None))
            if terminal:
                shown = "  ".join(f"{k} {record[k]:.4g}" for k in ("loss", "eval_loss", "learning_rate") if k in record)
                print(f"step {record['step']}/{record['max_steps']}  {shown}", file=terminal)

    return RunRecorder()
