"""The records a run's metrics.jsonl and errors.jsonl carry, typed, and their incremental readers.

Rank 0 of the recipe writes them (backend/recipe/recorder.py; their file names are the recipe's,
backend/recipe/records.py); the run manager, the CLI and the page read them here. A line that is not a JSON
object is skipped, a field of the wrong type is dropped (a log record without a step is skipped), so one damaged
line never breaks a view. Pydantic parses and checks each line in one go (strict types; 3x faster than
json.loads and a check, measured on 50,000 log lines). backend/runs/folder.py has the rest of the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, TypeGuard

from pydantic import Field, TypeAdapter, ValidationError
from typing_extensions import Required, TypedDict  # pydantic needs this TypedDict on Python < 3.12

from tunedeck.backend.recipe.records import METRICS_FILE
from tunedeck.backend.runs.supervisor import json_objects  # the supervisor's reading of the same lines
from tunedeck.backend.runs.tail import LineTail


class GateVerdict(TypedDict, total=False):
    passed: bool
    problems: list[str]  # "asked 2 processes on 1 machine, got 1: ..."


class FlopsInputs(TypedDict, total=False):
    """What backend/spec/flops.py's flops_per_token reads, taken from the live model."""

    matmul_params: int
    layer_matmul_params: int
    trainable_params: int
    layers: int
    attention_width: int
    full: bool
    checkpointing: bool
    extra_forwards: int  # forward passes without gradients per trained token (flops.extra_forwards)
    sequences_per_row: int  # sequences a row's token count covers (DPO: chosen and rejected)


class RollbackFacts(TypedDict, total=False):
    """An attempt after a roll-back (recipe/health.py): where it resumed and what it changed."""

    rollbacks: int  # this is the n-th
    checkpoint_step: int
    bad_step: int  # the step whose log showed the blow-up first
    lr_scale: float  # of the job's learning rate
    skipped_steps: int  # optimizer steps of data skipped after the checkpoint


class SavedPosition(TypedDict, total=False):
    """A checkpoint's position.json (recipe/restore.py): where the run stood when it was saved."""

    step: int
    learning_rate: float | None
    rows: int  # rows the optimizer steps had seen: step x global batch
    global_batch: int
    data_parallel: int  # the processes it was saved on (sequence-parallel groups counted once)


class RestoredFacts(TypedDict, total=False):
    """What a resumed run got back from its checkpoint, read from the live objects (recipe/restore.py)."""

    checkpoint: str  # checkpoint-N
    step: int
    optimizer_step: int | None  # the optimizer's own step count (0: its moments were not restored)
    lr_schedule_step: int | None
    learning_rate: float | None
    data_rows: int | None  # the rows the Trainer skips to reach its data position
    ignore_data_skip: bool
    resharded_from: int | None  # a ZeRO checkpoint of this many processes, loaded in universal form
    saved: SavedPosition | None  # None: a checkpoint saved without position.json


class StartRecord(TypedDict, total=False):
    """What the run got, read from the live objects after setup (train.py's describe_run)."""

    event: Required[Literal["start"]]  # every record names its kind (parse_record reads it first)
    time: float
    world_size: int
    nodes: list[str]  # rank i runs on nodes[i]
    distributed_type: str  # accelerate's: NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP ...
    zero_stage: int | None
    sequence_parallel: int  # GPUs sharing each sequence (DeepSpeed Ulysses); 1 without
    environment: dict[str, str | None]  # each launch.env name as rank 0 saw it (None: not set)
    dataset_rows: dict[str, int]  # training rows each source gave: {"dataset.path": n, <dataset.mix entry>: n}
    fsdp: bool
    fsdp_version: int | None
    model_class: str  # the wrapped model: DistributedDataParallel, DeepSpeedEngine ...
    optimizer_class: str | None
    device: str
    backend: str | None  # the process group's: gloo, nccl
    method: str
    objective: str  # sft, dpo, kto or grpo
    reference: str | None  # DPO, KTO, GRPO (beta > 0): "adapters off", its class, "scored before training"; or None
    quantized_modules: dict[str, int]  # bitsandbytes layers in the model: {"Linear4bit": 21}
    trainable_params: int
    total_params: int
    frozen_dtypes: dict[str, int]
    lora_scaling: float | None  # what PEFT multiplies the adapters' update by (None: no adapters)
    neftune_noise_alpha: float | None  # NEFTune's alpha on the live input embeddings (None: off)
    max_steps: int
    resumed_from_step: int | None
    rollback: RollbackFacts  # only after a roll-back
    restored: RestoredFacts | None  # None on a fresh start
    network: dict | None  # the all-reduce sweep before the model loaded (recipe/network.py); None when not run
    load_gpu_peak_allocated_gb: list[float] | None  # per rank, right after loading
    load_host_peak_rss_gb: list[float]
    gate: GateVerdict
    # MFU's inputs (train.py's speed_facts): the GPU's NVML name (None on CPU), compute dtype, peak TFLOPS, source or note
    gpu_name: str | None
    compute_dtype: str
    peak_tflops: float | None
    peak_source: str
    mfu_note: str
    flops_inputs: FlopsInputs


class RankPart(TypedDict, total=False):
    """One rank's own part of a step, its means since the last logging step (recipe/rank_timing.py)."""

    rank: int
    host: str
    data_s: float  # waiting for its batch
    forward_s: float  # its forward pass


class LogRecord(TypedDict, total=False):
    """One logging step: training (loss ...) or evaluation (eval_loss ...)."""

    event: Required[Literal["log"]]
    time: float
    step: int
    max_steps: int
    epoch: float | None
    loss: float
    learning_rate: float
    grad_norm: float | None
    mean_token_accuracy: float
    num_tokens: float
    tokens_per_second: float
    seconds_per_step: float  # from the writing process's first log record on (monotonic clock): the ETA's pace
    eval_loss: float
    eval_mean_token_accuracy: float
    eval_general_text_loss: float  # dataset.general_text: the loss on the general-text sample (recipe/general_text.py)
    # DPO and KTO, of the training rows and (eval_) the held-out ones: the implicit rewards beta*log(policy/reference)
    reward_chosen: float  # of the chosen answers (KTO: the good ones)
    reward_rejected: float  # of the rejected answers (KTO: the bad ones)
    reward_margin: float  # their mean margin
    reward_accuracy: float  # the share of pairs where the chosen answer's reward is the higher (DPO)
    eval_reward_chosen: float
    eval_reward_rejected: float
    eval_reward_margin: float
    eval_reward_accuracy: float
    kl: float  # KTO's KL estimate; GRPO's KL to its reference (grpo.beta > 0)
    eval_kl: float
    nll_loss: float  # ORPO: the chosen answers' NLL (its SFT part)
    log_odds_ratio: float  # ORPO: log of the odds of chosen over rejected, its preference term before beta
    log_odds_chosen: float  # ORPO: the mean log odds of the chosen answers
    eval_nll_loss: float
    eval_log_odds_ratio: float
    eval_log_odds_chosen: float
    reward: float  # the answers' mean reward, summed over grpo.rewards
    reward_std: float  # the spread of the answers' rewards
    rewards: dict[str, float]  # each reward's mean by its grpo.rewards name: {"exact_answer": 0.3, ...}
    completion_length: float  # the answers' mean length in tokens
    completions_clipped: float  # the share of answers cut at grpo.max_completion_length (0-1)
    groups_without_signal: float  # the share of prompts whose answers all scored the same: nothing learnt (0-1)
    eval_reward: float  # GRPO's eval_ keys: the same of the held-out prompts' answers
    eval_reward_std: float
    eval_rewards: dict[str, float]
    eval_completion_length: float
    eval_completions_clipped: float
    eval_groups_without_signal: float
    mfu: float  # model FLOPs utilisation of the window (0-1), only with a known peak
    hfu: float  # hardware FLOPs utilisation: mfu plus activation checkpointing's recomputation
    gpu_peak_allocated_gb: list[float]  # per rank, highest so far (GPU runs only)
    gpu_peak_reserved_gb: list[float]
    ranks: list[RankPart]  # each rank's own part of a step (2 processes or more)
    # A dataset.mix run's (SFT, unpacked): each source's mean token loss, by its dataset_rows name (source_loss.py)
    loss_by_source: dict[str, float]
    eval_loss_by_source: dict[str, float]


class HealthRecord(TypedDict, total=False):
    """The training-health guard saw a symptom (recipe/health.py), and what the run did about it."""

    event: Required[Literal["health"]]
    time: float
    step: int  # the logging step it was confirmed at
    text: str  # "grad norm NaN", "loss 41.2 > 2x its running mean 0.8 for 4 logged steps"
    line: str  # "⚠ unhealthy: grad norm NaN at step 30"
    last_good_step: int
    hints: list[str]  # likely causes seen in practice
    policy: str  # training.health.policy
    action: str  # warned | stopped | rolled back
    why_not: str  # a roll-back asked for but not done: why
    checkpoint_step: int  # rolled back: to this checkpoint
    skip_steps: int  # and this many steps of data skipped
    lr_scale: float  # with the learning rate scaled so
    rollbacks: int  # the n-th roll-back


EndStatus = Literal["finished", "stopped", "failed", "rollback"]  # rollback: an attempt ended to roll back


class EndRecord(TypedDict, total=False):
    event: Required[Literal["end"]]
    time: float
    status: EndStatus
    runtime_s: float
    error: str | None
    health: dict | None  # the symptom that ended it (training.health), as the guard saw it


class ErrorRecord(TypedDict, total=False):
    """A line of errors.jsonl: a rank that failed."""

    rank: int
    time: float
    error: str
    traceback: str | None


Record = StartRecord | LogRecord | EndRecord | HealthRecord
_RECORDS = {
    "start": TypeAdapter(StartRecord),
    "log": TypeAdapter(LogRecord),
    "end": TypeAdapter(EndRecord),
    "health": TypeAdapter(HealthRecord),
}
_RECORD = TypeAdapter(Annotated[Record, Field(discriminator="event")])


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number (not a bool): what a metrics field must be before it is drawn or formatted."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_line(line: bytes | str) -> Record | None:
    """A line of metrics.jsonl as its typed record; None when it holds none."""
    try:
        return _placed(_RECORD.validate_json(line, strict=True))  # unknown keys are dropped
    except ValidationError:  # damaged: keep what is sound
        return next(map(parse_record, json_objects([line])), None)


def parse_record(raw: dict) -> Record | None:
    """A metrics.jsonl object as its typed record, fields of the wrong type dropped; None when it holds none."""
    adapter = _RECORDS.get(str(raw.get("event")))
    while adapter is not None:
        try:
            return _placed(adapter.validate_python(raw, strict=True))
        except ValidationError as exc:
            wrong = {e["loc"][0] for e in exc.errors() if e["loc"]}
            if not wrong:
                return None
            raw = {key: value for key, value in raw.items() if key not in wrong}
    return None


def _placed(record: Record) -> Record | None:
    """A log record without a step has nothing to be placed at: it is skipped."""
    return None if record["event"] == "log" and "step" not in record else record


class MetricsReader:
    """A run's metrics.jsonl as typed records, each returned once (reads only what was appended)."""

    def __init__(self, run_dir: Path | str):
        self._tail = LineTail(Path(run_dir) / METRICS_FILE)

    def read_new(self) -> list[Record]:
        return [record for record in map(parse_line, self._tail.read_lines()) if record is not None]


@dataclass(eq=False)
class RunRecords:
    """What metrics.jsonl has said so far."""

    start: StartRecord | None = None
    records: list[LogRecord] = field(default_factory=list)  # the log records, in order, of the steps that stand
    end: EndRecord | None = None
    evals: int = 0  # the log records that carry an eval loss
    health: list[HealthRecord] = field(default_factory=list)  # the guard's findings, in order
    superseded: list[LogRecord] = field(default_factory=list)  # steps trained again after a roll-back or requeue

    def add(self, new: list[Record]) -> bool:
        """Take new records in; True when there were any. A later attempt's start record (a roll-back, a requeued
        job) resumes from a checkpoint: the steps logged after it are trained again, and its records replace them,
        so the curve continues from the checkpoint."""
        for record in new:
            if record["event"] == "start":
                self._resume_at(record.get("resumed_from_step"))
                self.start, self.end = record, None
            elif record["event"] == "end":
                self.end = record
            elif record["event"] == "health":
                self.health.append(record)
            else:
                self.records.append(record)
                self.evals += "eval_loss" in record
        return bool(new)

    def _resume_at(self, step: int | None) -> None:
        if self.start is None:
            return
        step = step or 0
        again = [record for record in self.records if record.get("step", 0) > step]
        if again:
            self.superseded += again
            self.records = [record for record in self.records if record.get("step", 0) <= step]
            self.evals = sum("eval_loss" in record for record in self.records)

    @property
    def unhealthy(self) -> HealthRecord | None:
        """The guard's latest finding, unless a roll-back healed it (an attempt after it logged a healthy step)."""
        if not self.health:
            return None
        last = self.health[-1]
        if last.get("action") == "rolled back" and self.start and self.start.get("rollback"):
            return None
        return last

    @property
    def last(self) -> LogRecord | None:
        return self.records[-1] if self.records else None


def read_records(run_dir: Path | str) -> RunRecords:
    """Every record of a run's metrics.jsonl (none when it has none yet)."""
    run = RunRecords()
    run.add(MetricsReader(run_dir).read_new())
    return run


def source_label(source: str) -> str:
    """A dataset.mix source as a chart or table names it: the entry's file name and what follows it
    ("subtract.jsonl#300"); the job's own rows stay "dataset.path"."""
    return source if source == "dataset.path" else source.rsplit("/", 1)[-1]
