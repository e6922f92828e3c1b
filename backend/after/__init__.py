"""After a run: try its model, evaluate it, merge its adapter, export it to GGUF, push it to the Hub; all read run
folders.

The face: the panel and the CLI import these names from `tunedeck.backend.after`, never its modules. The
modules that import torch (worker.py, generate.py, merge.py's work, model_load.py, evaluate.py's scoring) run in
the worker process (`python -m tunedeck.backend.after.worker`); nothing named here imports torch at import.
"""

from tunedeck.backend.after.benchmarks import DEFAULT_LIMIT, check_task_dir, parse_tasks
from tunedeck.backend.after.eval_answers import ANSWERS_DIR, SHOW, answers_jsonl, answers_table, newest_answers
from tunedeck.backend.after.eval_data import (
    EvalDataError,
    eval_source,
    sample_training_rows,
    seen_in_training,
    seen_warning,
)
from tunedeck.backend.after.eval_results import read_eval, table_columns, table_rows
from tunedeck.backend.after.examples import Example, data_examples, pick, verdict
from tunedeck.backend.after.general_text import BUILTIN_NAME, forgetting_lines, read_general_text
from tunedeck.backend.after.gguf_export import EXPORT_FILE, QUANTS, parse_quants
from tunedeck.backend.after.gguf_tools import converter as llama_cpp_converter
from tunedeck.backend.after.hub import push_folder
from tunedeck.backend.after.merge import check_output_dir
from tunedeck.backend.after.ollama_create import create_model, default_host, server_models
from tunedeck.backend.after.prompting import (
    EXPORT_CHECK_PROMPTS,
    MAX_NEW_TOKENS,
    GenerationSettings,
    SettingsError,
    answer_line,
    resolve_template,
    transcript,
)
from tunedeck.backend.after.scoring import order_key
from tunedeck.backend.after.worker_client import (
    DEFAULT_IDLE_TIMEOUT_S,
    ModelWorker,
    WorkerError,
    WorkerPool,
    run_export,
    run_task,
)

__all__ = [
    "ANSWERS_DIR",
    "BUILTIN_NAME",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_LIMIT",
    "EXPORT_CHECK_PROMPTS",
    "EXPORT_FILE",
    "MAX_NEW_TOKENS",
    "QUANTS",
    "SHOW",
    "EvalDataError",
    "Example",
    "GenerationSettings",
    "ModelWorker",
    "SettingsError",
    "WorkerError",
    "WorkerPool",
    "answer_line",
    "answers_jsonl",
    "answers_table",
    "check_output_dir",
    "check_task_dir",
    "create_model",
    "data_examples",
    "default_host",
    "eval_source",
    "forgetting_lines",
    "llama_cpp_converter",
    "newest_answers",
    "order_key",
    "parse_quants",
    "parse_tasks",
    "pick",
    "push_folder",
    "read_eval",
    "read_general_text",
    "resolve_template",
    "run_export",
    "run_task",
    "sample_training_rows",
    "seen_in_training",
    "seen_warning",
    "server_models",
    "table_columns",
    "table_rows",
    "transcript",
    "verdict",
]
