"""The training recipe: what every bundle runs (tunedeck_recipe/ beside its train_sft.py), and the facts tunedeck
shares with it.

The recipe runs without tunedeck, so the facts both sides need live here and tunedeck imports them: the vocabulary
(strategies, dataset formats), the run folder's record names, the dataset.mix pattern, the FLOPs formula and GPU
table. Every module imports only the standard library at import time (the panel reads these tables and never
imports torch), its siblings relatively, and the training stack inside the functions that need it.
train_sft.py is the entry (main, train, its arguments); docs of each module at its top.
"""

from .checkpoints import INCOMPLETE_DIR
from .checks import dataset_problems, input_problems
from .data import (
    DATA_FILE_BUILDERS,
    MIX_ENTRY,
    load_datasets,
    load_split,
    looks_local,
    mix_sources,
    mixed_in,
    prompts_within,
    trains_on,
)
from .formats import ALPACA_PROMPT, FORMAT_COLUMNS, KIND_NEEDS, as_label, column, in_job_format, to_trl_format
from .gate import GateError, check_processes, expected_run, expected_trainable, gate_problems
from .general_text import BUILTIN as GENERAL_TEXT_BUILTIN
from .general_text import METRIC as GENERAL_TEXT_LOSS
from .general_text import sample_path as general_text_sample
from .job import JobError, read_yaml
from .layout import Layout
from .models import load_tokenizer, peft_config, quantization_config, torch_dtype
from .notifications import NOTIFY_ENV, notify, notify_target, webhook_service
from .objectives import grpo_record, objective_classes
from .objectives_table import OBJECTIVES, Objective
from .recorder import make_callback
from .records import (
    ANSWERS_FILE,
    PROGRESS_FILE,
    RANK_STARTUP_FILE,
    STARTUP_FILE,
    STOP_FILE,
    JsonlWriter,
    StartupPhases,
    StopRequest,
    last_record,
    show_each_warning_once,
    write_progress,
)
from .rewards import (
    CUSTOM_REWARD,
    REWARD_FUNCTIONS,
    RewardError,
    close_answer,
    exact_answer,
    reward_functions,
    unscored_warning,
    write_answers,
)
from .speed import speed_facts
from .vocabulary import DATASET_FORMATS, STRATEGIES
from .watchdog import CHECKPOINT_SAVING, IMPORTING_REWARDS, STALL_GAP_FACTOR, StallWatchdog, watched_phase

__all__ = [
    "ALPACA_PROMPT",
    "ANSWERS_FILE",
    "CHECKPOINT_SAVING",
    "CUSTOM_REWARD",
    "DATASET_FORMATS",
    "DATA_FILE_BUILDERS",
    "FORMAT_COLUMNS",
    "GENERAL_TEXT_BUILTIN",
    "GENERAL_TEXT_LOSS",
    "IMPORTING_REWARDS",
    "INCOMPLETE_DIR",
    "KIND_NEEDS",
    "MIX_ENTRY",
    "NOTIFY_ENV",
    "OBJECTIVES",
    "PROGRESS_FILE",
    "RANK_STARTUP_FILE",
    "REWARD_FUNCTIONS",
    "STALL_GAP_FACTOR",
    "STARTUP_FILE",
    "STOP_FILE",
    "STRATEGIES",
    "GateError",
    "JobError",
    "JsonlWriter",
    "Layout",
    "Objective",
    "RewardError",
    "StallWatchdog",
    "StartupPhases",
    "StopRequest",
    "as_label",
    "check_processes",
    "close_answer",
    "column",
    "dataset_problems",
    "exact_answer",
    "expected_run",
    "expected_trainable",
    "gate_problems",
    "general_text_sample",
    "grpo_record",
    "in_job_format",
    "input_problems",
    "last_record",
    "load_datasets",
    "load_split",
    "load_tokenizer",
    "looks_local",
    "make_callback",
    "mix_sources",
    "mixed_in",
    "notify",
    "notify_target",
    "objective_classes",
    "peft_config",
    "prompts_within",
    "quantization_config",
    "read_yaml",
    "reward_functions",
    "show_each_warning_once",
    "speed_facts",
    "to_trl_format",
    "torch_dtype",
    "trains_on",
    "unscored_warning",
    "watched_phase",
    "webhook_service",
    "write_answers",
    "write_progress",
]  # fmt: skip
