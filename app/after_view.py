"""What the Try / Evaluate / Export tab does (app/after_tab.py lays it out): chat with a run, score it, merge it.

The heavy work happens in worker processes (backend/after/worker_client.py); this module picks the
run's weights, streams answers side by side, shows progress, and confines what the page may
name on disk: merged models go to <run>/merged/<name>/, uploads are read where Gradio put them.
Handlers take plain values and return (or yield, for streams) {component id: value} for the ids
in COMPONENTS; the tab makes the components under those ids and wires them, turning USER_ERRORS
into messages (gr.Error). Nothing here imports torch: test_imports checks every app module.

The models a browser session loaded are remembered by session, so the session's end (its tab
closed) lets them go unless another session still uses them.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from tunedeck.app.downloads import BundleWriter
from tunedeck.app.eval_display import answers_shown, evaluated_on, evaluation, newest_source, refused, seen_line
from tunedeck.app.try_turns import answer_status, for_the_try_box, next_turns
from tunedeck.app.untrusted_text import as_text
from tunedeck.app.worker_tasks import in_background, side_by_side
from tunedeck.backend.after import (
    GenerationSettings,
    SettingsError,
    WorkerError,
    WorkerPool,
    answer_line,
    answers_jsonl,
    data_examples,
    eval_source,
    forgetting_lines,
    newest_answers,
    pick,
    read_eval,
    run_task,
    sample_training_rows,
    seen_in_training,
    transcript,
    verdict,
)
from tunedeck.backend.data import keep_upload
from tunedeck.backend.runs import AfterError, RunError, RunManager, UnreadableJob, list_weights
from tunedeck.backend.spec import JobSpec

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NO_COMPARISON = ""
COMPONENTS = (
    "after.run", "after.weights", "after.compare", "after.prompt", "after.max_new_tokens", "after.temperature",
    "after.top_p", "after.repetition_penalty", "after.stop", "after.answer", "after.compare_answer", "after.status",
    "after.eval_scope", "after.eval_data", "after.eval_table", "after.eval_chart", "after.eval_status",
    "after.merge_weights", "after.merge_name", "after.merge_dtype", "after.merge_status", "after.repo_id", "after.token",
    "after.eval_limit", "after.serve", "after.expected", "after.example_note", "after.history", "after.system",
    "after.answers", "after.answers_show", "after.answers_note", "after.answers_file", "after.eval_tasks",
    "after.eval_tasks_limit", "after.eval_forgetting", "after.eval_general_text", "after.gguf_quants",
    "after.gguf_status", "after.modelfile", "after.export_check", "after.ollama_host", "after.ollama_create",
    "after.ollama_status",
)  # fmt: skip
Model = tuple  # (run id, checkpoint step or None, base?): one loaded model, one worker
USER_ERRORS = (AfterError, WorkerError, SettingsError)  # their message is the whole story: show it as it is


class AfterView:
    def __init__(self, manager: RunManager, pool: WorkerPool | None = None, downloads: BundleWriter | None = None):
        self.manager = manager
        self.pool = pool or WorkerPool()
        self.components: dict = {}
        self._held: dict[str, set[Model]] = {}  # browser session -> the models it loaded
        self._held_lock = threading.Lock()
        self._examples: dict[
            str, tuple[list[tuple[object, str]], str, bool]
        ] = {}  # run id -> its data's (prompt, answer) pairs, source, held out?
        self._downloads = downloads or BundleWriter()  # the answers file offered for download

    # ------------------------------------------------------------ choices

    def run_and_job(self, run_id: str) -> tuple[Path, JobSpec]:
        if not run_id:
            raise AfterError("pick a run first")
        try:
            self.manager.status(run_id)
        except RunError as exc:
            raise AfterError(str(exc)) from None
        job = self.manager.job(run_id)
        if isinstance(job, UnreadableJob):
            raise AfterError(f"run {run_id}: {job.explained()}")
        return self.manager.run_dir(run_id), job

    def run_choices(self) -> list[tuple[str, str]]:
        """(label, run id) of every run with something to try: a final adapter or a checkpoint, live runs too."""
        choices = []
        for run in self.manager.list_runs():
            job = self.manager.job(run.run_id)
            if isinstance(job, UnreadableJob) or job.method not in ("lora", "qlora"):
                continue  # unreadable, or a full fine-tune: its output is already a standalone model
            saved = [w.name for w in list_weights(self.manager.run_dir(run.run_id), job)[1:]]
            if saved:
                newest = "final adapter" if saved[-1] == "final" else f"{len(saved)} checkpoint{'s' * (len(saved) > 1)}"
                choices.append((f"{run.run_id} · {run.state} · {newest} · {run.title}", run.run_id))
        return choices

    def weights_choices(self, run_id: str) -> list[tuple[str, str]]:
        """(label, value) of what the run can be tried with: its final adapter, each checkpoint, its base."""
        run_dir, job = self.run_and_job(run_id)
        found = list_weights(run_dir, job)
        labels = {
            "deepspeed": " · ZeRO shards, consolidated on first use",
            "fsdp": " · FSDP shards, consolidated on first use",
        }
        choices = [
            (w.name.replace("final", "final adapter") + labels.get(w.layout, ""), w.name) for w in reversed(found[1:])
        ]
        return choices + [("base model (no adapter)", "base")]

    def compare_choices(self, run_id: str) -> list[tuple[str, str]]:
        """Beside the answer: nobody, the base of this run, or another run's final adapter (an overlay)."""
        others = [
            (f"run {r.run_id} · {r.title}", f"run:{r.run_id}") for r in self.manager.list_runs() if r.run_id != run_id
        ]
        return [("no comparison", NO_COMPARISON), ("the base model", "base"), *others]

    @staticmethod
    def weights_choice(value: str) -> tuple[int | None, bool]:
        """(checkpoint step, base?) of a weights value: "final", "checkpoint-N" or "base"."""
        if value == "base":
            return None, True
        if value.startswith("checkpoint-") and value[len("checkpoint-") :].isdigit():
            return int(value[len("checkpoint-") :]), False
        return None, False

    # ------------------------------------------------------------ try

    def answer(
        self,
        run_id: str,
        weights: str,
        compare: str,
        prompt: str,
        settings: dict,
        session: str = "",
        expected: str | None = None,
        history: dict[str, list] | None = None,
        system: str = "",
    ) -> Iterator[dict]:
        """Stream the answer (and the comparison's, side by side): {component id: value} per update; at the end,
        how each answer went (tokens, time, why it ended, and against `expected`, the data's answer, if given).

        With `history` ({answer box id: [(user, assistant), ...]}, {} to start), a conversation: each model
        with a chat template sees its earlier turns, its box shows them, and the last update carries the
        history with this turn ("after.history"); a model without a chat template answers the prompt alone.
        `system`, a system message, goes first to each model with a chat template."""
        settings_ok = GenerationSettings.from_dict(settings)
        if not prompt.strip():
            raise AfterError("prompt: type a prompt first")
        models = {"after.answer": (run_id, *self.weights_choice(weights))}
        if compare == "base":
            models["after.compare_answer"] = (run_id, None, True)
        elif compare.startswith("run:"):
            models["after.compare_answer"] = (compare[len("run:") :], None, False)
        yield {
            "after.status": "loading the model" + ("s" if len(models) > 1 else "") + " (the first answer takes longer)"
        }
        for rid, _, _ in models.values():
            self.run_and_job(rid)
        with self._held_lock:
            self._held.setdefault(session, set()).update(models.values())
        # Each model loads, then answers at once, in its own thread: a model loaded first does not sit
        # idle (its worker's idle timeout runs) while the other one still loads.
        events: queue.Queue = queue.Queue()
        streams = {
            key: self._load_then_answer(
                key, model, prompt, settings_ok, events, None if history is None else list(history.get(key, [])), system
            )
            for key, model in models.items()
        }
        workers, answered, status = {}, {}, ""
        for texts in side_by_side(streams, every_s=0.25):
            status = answer_status(events, workers, answered, models) or status
            yield {**texts, "after.status": status}
        answer_status(events, workers, answered, models)
        if answered:
            infos = {key: workers[key].info for key in models if key in answered}
            lines = [
                f"**{as_text(info['description'])}** on {as_text(info['device'])}: {as_text(answer_line(answered[key]))}"
                + (f" · {verdict(answered[key]['text'], expected)}" if expected is not None else "")
                for key, info in infos.items()
            ]
            lines += [
                f"⚠ {as_text(w)}" for w in dict.fromkeys(i["warning"] for i in infos.values() if i.get("warning"))
            ]
            yield {"after.status": "\n\n".join(lines)}
        if history is not None:
            chat = {key for key in answered if workers[key].info.get("template") == "chat"}
            yield {"after.history": next_turns(history, prompt, {k: answered[k]["text"] for k in chat}, models)}

    def converses(self, run_id: str) -> bool:
        """Whether the run trained on conversations (messages data, through the chat template)."""
        return bool(run_id) and self.run_and_job(run_id)[1].dataset.format == "messages"

    def example(self, run_id: str, number: int | None = None, conversing: bool = True) -> dict:
        """A prompt from the run's data (held out first) for the prompt box, and the data's answer beside it;
        of a conversation, its system message and (when `conversing`) its earlier turns: a new conversation."""
        if run_id not in self._examples:
            self._examples[run_id] = data_examples(*self.run_and_job(run_id))
        return for_the_try_box(pick(*self._examples[run_id], number), conversing)

    def evaluated_example(self, run_id: str, number: int, conversing: bool = True) -> dict:
        """Example `number` (the answers table's #) of the newest evaluation, for the Try box as example() gives
        one: a row a model got wrong, tried again with other settings or another checkpoint."""
        run_dir, job = self.run_and_job(run_id)
        data = read_eval(run_dir)
        answers = newest_answers(run_dir, data)
        if not answers:
            raise AfterError("example: the run has no evaluation answers; press Evaluate first")
        rows = next(iter(answers.values()))
        source = data["results"][next(iter(answers))].get("data") or ""
        # Held out unless it is the training file itself ("train.jsonl [test]" is another split of it), a copy of
        # it, or rows sampled from it.
        held_out = Path(source).name != Path(job.dataset.path).name
        held_out = held_out and not seen_in_training(run_dir, job, source)
        pairs = [(row["prompt"], row["expected"]) for row in rows]
        return for_the_try_box(pick(pairs, source, held_out, number), conversing)

    def _load_then_answer(
        self, key: str, model: Model, prompt: str, settings, events: queue.Queue, turns: list | None, system: str
    ) -> Iterator[str]:
        worker = self.pool.get(self.manager.runs_dir, *model, on_event=events.put)
        events.put({"event": "loaded", "key": key, "worker": worker})
        conversing = turns is not None and worker.info.get("template") == "chat"
        # The page learns where the model runs before its first token; in a conversation, the turns so far.
        yield transcript(turns, prompt) if conversing and turns is not None else ""
        summary = yield from worker.generate(prompt, settings, history=turns if conversing else None, system=system)
        events.put({"event": "answered", "key": key, "summary": summary})
        return summary

    def release(self, run_id: str) -> dict:
        """Let every model of this run go: their worker processes end."""
        released = sum(
            self.pool.release(self.manager.runs_dir, run_id, *self.weights_choice(value))
            for _, value in self.weights_choices(run_id)
        )
        return {"after.status": f"released {released} model{'s' if released != 1 else ''} of run {run_id}"}

    def release_session(self, session: str, shared_too: bool = True) -> dict:
        """Let the models this browser session loaded go (the Release button; its tab closing, shared_too=False:
        a model another session also uses stays)."""
        with self._held_lock:
            mine = self._held.pop(session, set())
            others = set().union(*self._held.values()) if self._held else set()
        ending = mine if shared_too else mine - others
        released = sum(self.pool.release(self.manager.runs_dir, *model) for model in ending)
        return {"after.status": f"released {released} model{'s' if released != 1 else ''}; their processes ended"}

    # ------------------------------------------------------------ evaluate

    def eval_view(self, run_id: str, show: str = "all") -> dict:
        """The table and chart of what eval.json holds (shown again when the run is reopened), and the newest
        evaluation's answers side by side (`show`: eval_answers.SHOW)."""
        run_dir, job = self.run_and_job(run_id)
        data = read_eval(run_dir)
        status = evaluated_on(data)
        note = seen_line(seen_in_training(run_dir, job, newest_source(data) or ""))
        status += f"\n\n{note}" if note else ""
        status += "".join(f"\n\n{as_text(line)}" for line in forgetting_lines(data.get("results") or {}))
        return {**evaluation(data), "after.eval_status": status, **self.answers_view(run_id, show, data)}

    def answers_view(self, run_id: str, show: str, data: dict | None = None) -> dict:
        """The newest evaluation's answers side by side, filtered; the file of them all to download."""
        run_dir = self.manager.run_dir(run_id)
        answers = newest_answers(run_dir, read_eval(run_dir) if data is None else data)
        download = (
            self._downloads.write({"answers.jsonl": answers_jsonl(answers)}, "answers.zip")[1][0] if answers else None
        )
        return {**answers_shown(answers, show), "after.answers_file": download}

    def evaluate(
        self,
        run_id: str,
        scope: str,
        data_file: str | None = None,
        limit: int | None = None,
        show: str = "all",
        training_rows: int | None = None,
        checks: dict | None = None,
    ) -> Iterator[dict]:
        """Evaluate in a worker; yield progress, then the table and chart; `training_rows`: on that many rows of
        the run's training file; `checks`: benchmarks and the forgetting check (eval_checks). What stops it goes to
        the status line, in the page's words, not to a toast."""
        try:
            yield from self._evaluate(run_id, scope, data_file, limit, show, training_rows, checks or {})
        except USER_ERRORS as exc:
            yield {"after.eval_status": refused(exc)}

    def _evaluate(self, run_id, scope, data_file, limit, show, training_rows, checks) -> Iterator[dict]:
        run_dir, job = self.run_and_job(run_id)
        weights = [w.name for w in list_weights(run_dir, job)]
        names = weights if scope == "all" else ["base", weights[-1]]
        if len(names) < 2:
            raise AfterError(f"run {run_id} has saved no adapter yet: evaluate it once it has saved a checkpoint")
        if training_rows:
            data_file = str(sample_training_rows(run_dir, job, training_rows))
        elif data_file:  # the page's upload folder goes with the panel: kept where eval.json can name it for good
            data_file = str(keep_upload([Path(data_file)], self.manager.runs_dir)[0])
        _, _, source = eval_source(run_dir, job, data_file)  # no data: said before a worker starts
        note = seen_line(seen_in_training(run_dir, job, source))
        note = f"\n\n{note}" if note else ""
        args = {"run_id": run_id, "names": names, "data": data_file, "limit": limit, **checks}
        for event in in_background(lambda on_event: run_task("evaluate", args, job, self.manager.runs_dir, on_event)):
            yield {"after.eval_status": as_text(event) + note}
        yield self.eval_view(run_id, show)

    def eval_data_note(self, run_id: str, data_file: str | None) -> dict:
        """An evaluation file just picked: a warning when it is the run's training file (by path or content)."""
        if not run_id or not data_file:
            return {}
        run_dir, job = self.run_and_job(run_id)
        note = seen_line(seen_in_training(run_dir, job, str(Path(data_file).resolve())))
        return {"after.eval_status": note} if note else {}
