"""Following a run in the terminal: its start facts, a progress line per log record, Ctrl-C to stop it."""

from __future__ import annotations

import re
import signal
import sys
import time

from tunedeck.backend.runs import (
    ACTIVE_STATES,
    TRAINING,
    LogRecord,
    MetricsReader,
    RunRecords,
    RunSummary,
    behind_now,
    facts_line,
    read_phases,
    summarize,
)


def follow(manager, run_id: str, also_stop: tuple[str, ...] = ()):
    """Print the start facts and a progress line per log record until the run ends; Ctrl-C stops it (and the
    runs of `also_stop`: a sweep's queued runs).

    Returns the final status, or None when a second Ctrl-C left the run stopping in the background.
    Ctrl-C is counted, not raised, so that no press can cut a stop request in half.
    """
    presses: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda *_: presses.append(1))
    try:
        return _follow_counting(manager, run_id, presses, also_stop)
    finally:
        signal.signal(signal.SIGINT, previous)


def _follow_counting(manager, run_id: str, presses: list[int], also_stop: tuple[str, ...] = ()):
    reader, run = MetricsReader(manager.run_dir(run_id)), RunRecords()
    bar = ProgressBar(sys.stdout)
    stopping = False
    where = ""
    told = 0  # startup phases printed
    behind = ""  # the ranks last said to be behind rank 0, without their times
    while True:
        if presses and not stopping:
            stopping = True
            bar.close()
            print(
                "stopping: the ranks finish their step and save a checkpoint (Ctrl-C again to leave)", file=sys.stderr
            )
            if also_stop:
                print(f"and the {len(also_stop)} runs queued after it leave the queue", file=sys.stderr)
            for stopped in (run_id, *also_stop):
                manager.stop(stopped)
        if len(presses) > 1:
            bar.close()
            print(f"left run {run_id} stopping in the background", file=sys.stderr)
            return None
        status = manager.status(run_id)
        if status.where and _where_changed(where, status):  # a Slurm run: its queue state, then its nodes
            where = status.where
            bar.close()
            print(f"{status.state}: {where}", flush=True)
        told = _print_new_phases(manager.run_dir(run_id), told, bar)
        if not run.records:
            behind = _print_ranks_behind(manager.run_dir(run_id), behind, bar)
        for record in reader.read_new():
            run.add([record])
            if record["event"] == "start":
                print(facts_line(record, manager.job(run_id)), flush=True)
            elif record["event"] == "log":
                bar.update(record, summarize(run, status.started_at, None, now=record.get("time")))
        if status.state not in ACTIVE_STATES:
            bar.close()
            return status
        time.sleep(0.5)


def _print_new_phases(run_dir, told: int, bar) -> int:
    """Print each phase before the first step as the run enters it ("loading the model ..."); how many are told."""
    phases = read_phases(run_dir)
    if len(phases) < told:  # a requeued job starts its list again
        told = 0
    for phase, _ in phases[told:]:
        if phase != TRAINING:
            bar.close()
            print(f"{phase} ...", flush=True)
    return len(phases)


def _print_ranks_behind(run_dir, said: str, bar) -> str:
    """Print the ranks rank 0 waits for ("  waiting: rank 3 on gpu-b still loading the model for 2:10") when
    they change, not as their times grow; returns what was said, without the times."""
    phases = read_phases(run_dir)
    behind = behind_now(run_dir, phases, time.time()) if phases else None
    key = re.sub(r" for \d+:\d\d", "", behind or "")
    if behind and key != said:
        bar.close()
        print(f"  waiting: {behind}", flush=True)
    return key


def _where_changed(shown: str, status) -> bool:
    """Print Slurm's view when its state, reason or nodes change (not the expected start alone)."""
    return status.where.split(" · expected start")[0] != shown.split(" · expected start")[0]


def _chosen_wins(record: LogRecord, prefix: str = "") -> str:
    """A DPO run's share of pairs where the chosen answer wins (KTO, which has no pairs: the reward margin between
    good and bad answers; GRPO: the answers' mean reward and the share of prompts whose answers all scored alike),
    as a suffix of the progress line."""
    share, margin = record.get(f"{prefix}reward_accuracy"), record.get(f"{prefix}reward_margin")
    reward, alike = record.get(f"{prefix}reward"), record.get(f"{prefix}groups_without_signal")
    if reward is not None:
        return f" · reward {reward:.3f}" + ("" if alike is None else f" · {alike:.0%} of prompts scored alike")
    if share is not None:
        return f" · chosen wins {share:.0%}"
    return "" if margin is None else f" · reward margin {margin:+.2f}"


class ProgressBar:
    """One updating line on a terminal (the run summary's progress and the loss); one line per update otherwise."""

    WIDTH = 24

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self.drawn = False

    def update(self, record: LogRecord, summary: RunSummary) -> None:
        if "loss" not in record:  # an evaluation record
            text = f"{summary.step_text}  eval_loss {record.get('eval_loss', float('nan')):.4f}"
            self._emit(text + _chosen_wins(record, "eval_"), newline=True)
            return
        filled = int(self.WIDTH * summary.fraction)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        text = f"[{bar}] {summary.progress} · loss {record['loss']:.4f}{_chosen_wins(record)}"
        self._emit(text, newline=not self.tty)

    def _emit(self, text: str, newline: bool) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if newline else ""))
            self.drawn = not newline
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
