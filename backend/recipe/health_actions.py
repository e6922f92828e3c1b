"""What the run does when the health guard (health.py) confirms a symptom at a logging step: the ranks agree, then
warn (a health record, training goes on), stop (the run ends as failed, naming the symptom and its hints) or roll
back (rank 0 writes the request, rollback.py, and every rank ends this attempt). While a spike is under way no
checkpoint is saved, so that every checkpoint kept predates the first bad step.
"""

from __future__ import annotations

import time
from pathlib import Path

from .health import HealthGuard, Symptom, Unhealthy
from .ranks import _any_rank
from .rollback import checkpoint_before, plan_rollback, write_rollback


class HealthActions:
    def __init__(self, job: dict, metrics, terminal, first_step: int = 0):
        self.job, self.metrics, self.terminal = job, metrics, terminal
        self.guard = HealthGuard(job, first_step)

    @property
    def policy(self) -> str:
        return self.guard.policy

    def on_log(self, args, state, control, logs: dict) -> None:
        """The guard on this logging step (collective: every rank calls it at every logging step)."""
        symptom = self.guard.check(state.global_step, logs.get("loss"), logs.get("grad_norm"))
        if self.guard.suspect:
            control.should_save = False  # no checkpoint of a state that may be broken
        ending = symptom is not None and self.policy in ("stop", "rollback")
        if not _any_rank(ending, args.device):  # every rank ends together, or one would wait forever
            if symptom is not None:
                self._tell(symptom, "warned", state.global_step)
            return
        if symptom is None:  # another rank saw it: follow
            raise Unhealthy(self.guard.last_symptom(state.global_step), "stop", "stopped with the other ranks")
        why_not = ""
        if self.policy == "rollback":
            plan, why_not = plan_rollback(symptom, self.job, args.output_dir)
            if plan is not None:
                if self.metrics:
                    write_rollback(Path.cwd(), plan)
                self._tell(symptom, "rolled back", state.global_step, plan)
                raise Unhealthy(
                    symptom,
                    "rollback",
                    f"{symptom.line}: rolling back to step {plan['checkpoint_step']} with the learning rate "
                    f"x{plan['lr_scale']:g}, skipping {plan['skip_steps']} steps of data",
                )
        self._tell(symptom, "stopped", state.global_step, why_not=why_not)
        found = checkpoint_before(args.output_dir, symptom.last_good_step)
        kept = f"; the newest checkpoint (step {found[1]}) predates it" if found else ""
        message = symptom.line + (f" (no roll-back: {why_not})" if why_not else "") + kept
        raise Unhealthy(symptom, "stop", message + ". " + " ".join(f"Hint: {h}." for h in symptom.hints[:2]))

    def _tell(self, symptom: Symptom, action: str, step: int, plan: dict | None = None, why_not: str = "") -> None:
        """Rank 0: the health record in metrics.jsonl (the page's state line, runs show, the notification)."""
        if not self.metrics:
            return
        record = {"event": "health", "time": time.time(), "step": step, "action": action, **vars(symptom)}
        record.update(policy=self.policy, line=symptom.line)
        if plan:
            record.update({key: plan[key] for key in ("checkpoint_step", "skip_steps", "lr_scale", "rollbacks")})
        if why_not:
            record["why_not"] = why_not
        self.metrics.write(record)
        if self.terminal:
            print(f"{symptom.line}: {action}", file=self.terminal)
