"""The run-folder contract (backend/runs/folder.py) against the two writers that cannot import it.

train.py (shipped as train_sft.py) and the supervisor run without tunedeck, so they spell the
run folder's file names and record keys themselves. These tests read their source and compare
every literal name and key with the contract: a rename on one side alone fails here, and the
mutation tests show that it does.
"""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from tunedeck.app import charts
from tunedeck.backend import recipe
from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import records as run_records
from tunedeck.backend.runs import startup as run_startup
from tunedeck.backend.runs import status as run_status
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.folder import (
    ProcessIdentity,
    Progress,
    RestartSettings,
    Stalled,
    StallSettings,
    StatusFile,
    StopRequest,
)
from tunedeck.backend.runs.records import EndRecord, ErrorRecord, GateVerdict, LogRecord, StartRecord, read_records

# The recipe's modules as one text (their __future__ lines left out: they may only open a file).
TRAIN = "\n".join(
    line
    for path in sorted(Path(inspect.getsourcefile(recipe)).parent.glob("*.py"))
    for line in path.read_text(encoding="utf-8").splitlines()
    if line != "from __future__ import annotations"
)
SUPERVISOR = Path(inspect.getsourcefile(supervisor)).read_text(encoding="utf-8")


# ---------------------------------------------------------------- reading the writers' source


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dicts(node: ast.AST) -> list[set[str]]:
    """The literal keys of every dict display under node."""
    return [{_str(k) for k in d.keys if _str(k)} for d in ast.walk(node) if isinstance(d, ast.Dict)]


def _returned_dict(fn: ast.FunctionDef) -> set[str]:
    return next(_dicts(n.value)[0] for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict))


def _stores(node: ast.AST, var: str) -> list[ast.Subscript]:
    """`var[...] = ...` under node."""
    return [
        n for n in ast.walk(node)
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and getattr(n.value, "id", None) == var
    ]  # fmt: skip


def _stored_keys(fn: ast.AST, var: str = "record") -> set[str]:
    """Keys written into `var`: `var = {...}`, `var["k"] = ...`, and `for key in ("a", "b"): var[key] = ...`."""
    keys = {_str(n.slice) for n in _stores(fn, var) if _str(n.slice)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == var for t in node.targets):
            keys |= set().union(*_dicts(node.value)[:1])
        loop = isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple)
        if loop and any(getattr(n.slice, "id", None) == getattr(node.target, "id", "") for n in _stores(node, var)):
            keys |= {_str(e) for e in node.iter.elts if _str(e)}
    return keys


def _read_keys(fn: ast.AST, method: str = "get") -> set[str]:
    """String keys read in fn: `x.get("k")` and `x["k"]`."""
    keys = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and node.args
        ):
            keys |= {_str(node.args[0])} - {None}
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _str(node.slice):
            keys.add(_str(node.slice))
    return keys


def _fstrings(tree: ast.AST) -> list[str]:
    """Every f-string as a template, its fields written {}."""
    return [
        "".join(_str(v) if _str(v) is not None else "{}" for v in node.values)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
    ]


def objective_keys(tree: ast.AST) -> set[str]:
    """The keys of the objectives' log records: each row's record keys in the Objective table (its definitions, run
    from the source), and GRPO's grpo_record's `record[f"{prefix}rewards"]` for each prefix of its loop."""
    table = ("Objective", "SFT_FORMATS", "REWARDS", "WINS")
    nodes = [
        n
        for n in tree.body
        if (isinstance(n, ast.ClassDef) and n.name in table)
        or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) in table)
        or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "OBJECTIVES")  # the table itself
    ]
    namespace: dict = {"dataclass": dataclass, "Any": Any}
    exec(compile(ast.Module(nodes, []), "objectives_table.py", "exec"), namespace)
    keys = {key for row in namespace["OBJECTIVES"].values() for key in row.record_keys}
    function = _function(tree, "grpo_record")
    for loop in (n for n in ast.walk(function) if isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple)):
        prefixes = [_str(e) for e in loop.iter.elts]
        templates = [t for store in _stores(loop, "record") for t in _fstrings(store.slice)]
        keys |= {t.replace("{}", prefix) for t in templates for prefix in prefixes}
    return keys


def train_records(source: str) -> dict[str, set[str]]:
    """The keys of each record train.py writes, read from its source."""
    tree = ast.parse(source)
    main = _function(tree, "main")
    begin = _function(tree, "on_train_begin")
    gate = next(
        n.value
        for n in ast.walk(begin)
        if isinstance(n, ast.Assign) and any(_str(t.slice) == "gate" for t in _stores(n, "record"))
    )  # record["gate"] = {...}
    on_log = _function(tree, "_write_log")  # on_log's record
    calls = {getattr(n.func, "id", None) for n in ast.walk(on_log) if isinstance(n, ast.Call)}
    return {
        "start": _returned_dict(_function(tree, "describe_run"))
        | _returned_dict(_function(tree, "load_peaks"))
        | _stored_keys(begin)
        | _stored_keys(_function(tree, "speed_facts"), "facts"),  # record.update(speed_facts(...))
        "gate": _dicts(gate)[0],
        "log": _stored_keys(on_log)
        | set().union(*_dicts(_function(tree, "utilisation")), *_dicts(_function(tree, "_pace")))
        | (objective_keys(tree) if {"objective_record", "grpo_record"} <= calls else set()),
        "end": next(keys for keys in _dicts(main) if "event" in keys),
        "error": next(keys for keys in _dicts(main) if "rank" in keys),
    }


def train_files(source: str) -> set[str]:
    """What the recipe names in the run folder: `run_dir / "<name>"`, or `run_dir / NAME` by a constant."""
    return {
        _str(n.right) or n.right.id
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.BinOp)
        and isinstance(n.op, ast.Div)
        and getattr(n.left, "id", None) == "run_dir"
        and (_str(n.right) or isinstance(n.right, ast.Name))
    }


def typed_keys(record_type) -> set[str]:
    return set(record_type.__annotations__)


RECORD_TYPES = {"start": StartRecord, "gate": GateVerdict, "log": LogRecord, "end": EndRecord, "error": ErrorRecord}


def record_mismatches(source: str) -> dict[str, tuple[set[str], set[str]]]:
    """kind -> (keys train.py writes that the contract lacks, contract keys train.py does not write)."""
    found = train_records(source)
    return {
        kind: (found[kind] - typed_keys(t), typed_keys(t) - found[kind])
        for kind, t in RECORD_TYPES.items()
        if found[kind] != typed_keys(t)
    }


# ---------------------------------------------------------------- train.py


def test_train_writes_exactly_the_records_of_the_contract():
    assert record_mismatches(TRAIN) == {}


def test_a_key_renamed_in_train_alone_fails_the_contract():
    renamed = TRAIN.replace('"trainable_params": trainable', '"trainable": trainable')
    assert record_mismatches(renamed) == {"start": ({"trainable"}, {"trainable_params"})}
    dropped = TRAIN.replace('"grad_norm", "mean_token_accuracy"', '"mean_token_accuracy"')
    assert record_mismatches(dropped) == {"log": (set(), {"grad_norm"})}


def test_an_objectives_keys_renamed_in_train_alone_fail_the_contract():
    keys = objective_keys(ast.parse(TRAIN))
    assert {"reward", "rewards", "eval_rewards", "groups_without_signal", "eval_completion_length"} <= keys
    assert {"reward_accuracy", "eval_kl", "log_odds_ratio", "eval_nll_loss"} <= keys  # DPO's, KTO's, ORPO's
    renamed = TRAIN.replace('("completion_length", "completions/mean_length")', '("length", "completions/mean_length")')
    assert record_mismatches(renamed) == {
        "log": ({"length", "eval_length"}, {"completion_length", "eval_completion_length"})
    }
    renamed = TRAIN.replace('record[f"{prefix}rewards"]', 'record[f"{prefix}reward_means"]')
    assert record_mismatches(renamed) == {"log": ({"reward_means", "eval_reward_means"}, {"rewards", "eval_rewards"})}


def test_train_writes_the_files_of_the_contract():
    """The recipe names each file of the run folder by a constant of its records module, which the readers import."""
    named = train_files(TRAIN)
    assert {"METRICS_FILE", "ERRORS_FILE", "LOGS_DIR", "STOP_FILE", "PROGRESS_FILE", "STARTUP_FILE"} <= named
    assert all(isinstance(getattr(recipe.records, name, None), str) for name in named), named  # no literal name
    assert "errors.jsonl" in train_files(TRAIN.replace("run_dir / ERRORS_FILE", 'run_dir / "errors.jsonl"'))
    shared = ("METRICS_FILE", "ERRORS_FILE", "LOGS_DIR", "STOP_FILE")
    assert [getattr(run_folder, name) for name in shared] == [getattr(recipe.records, name) for name in shared]
    rank_log = Path(run_folder.rank_log(7)).name.replace("7", "{}")
    assert rank_log in _fstrings(ast.parse(TRAIN))  # logs / f"rank{rank}.log"


def test_train_end_statuses_are_the_contracts():
    tree = ast.parse(TRAIN)
    returned = {_str(n.value) for n in ast.walk(_function(tree, "train")) if isinstance(n, ast.Return)}
    preset = {  # main: `status, error = "failed", None` until train() returns
        _str(n.value.elts[0])
        for n in ast.walk(_function(tree, "main"))
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Tuple)
        and getattr(n.targets[0].elts[0], "id", None) == "status"
    }
    rollback = {  # main: `status = "rollback"` when the health guard ends this attempt for a roll-back
        _str(n.value)
        for n in ast.walk(_function(tree, "main"))
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "status" and _str(n.value)
    }
    statuses = returned | preset | rollback
    assert statuses == set(get_args(run_records.EndStatus)) == {"finished", "stopped", "failed", "rollback"}


# ---------------------------------------------------------------- the supervisor


def test_supervisor_names_the_files_of_the_contract():
    for name in ("STATUS_FILE", "STOP_FILE", "METRICS_FILE", "ERRORS_FILE", "LAUNCHER_LOG", "RESERVE_FILE"):
        assert getattr(supervisor, name) == getattr(run_folder, name), name
    assert recipe.STOP_FILE == run_folder.STOP_FILE  # the ranks read the stop request too
    assert recipe.PROGRESS_FILE == supervisor.PROGRESS_FILE  # rank 0 writes, it reads
    assert recipe.STARTUP_FILE == run_startup.STARTUP_FILE  # rank 0 writes its phases before step 1; the panel reads
    assert recipe.RANK_STARTUP_FILE == run_startup.RANK_STARTUP_FILE  # and the other ranks theirs, under logs/
    assert supervisor.STALL_GAP_FACTOR == recipe.STALL_GAP_FACTOR  # it marks a stall when the ranks see one
    assert supervisor.NOTIFY_ENV == recipe.NOTIFY_ENV  # it posts for a rank 0 killed before it could
    # "see logs/rank3.log" in a failure's headline
    assert any(run_folder.rank_log(7).replace("7", "{}") in f for f in _fstrings(ast.parse(SUPERVISOR)))


def supervisor_keys(source: str) -> dict[str, set[str]]:
    """What the supervisor writes into status.json and reads from the other files, by contract type."""
    tree = ast.parse(source)
    writes = {"update_status", "record_end", "_note"}
    status = {
        k.arg
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) in writes
        for k in n.keywords
        if k.arg and k.arg not in ("tries", "retry_s")
    }
    attempt = _function(tree, "_attempt")  # one start of the launcher, watched
    status |= _read_keys(_function(tree, "supervise")) | _read_keys(attempt)
    status |= set().union(*_dicts(_function(tree, "record_end")))
    # process_identity's dict, and the launcher's {**identity, "pgid": ...}
    identity = _returned_dict(_function(tree, "process_identity")) | set().union(*_dicts(attempt))
    watch = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "StallWatch")
    check = _function(watch, "check")
    phase = _function(watch, "_check_phase")
    return {
        "status": status,
        "identity": identity,
        "stop": _read_keys(_function(tree, "_grace_seconds")),
        "end": _read_keys(_function(tree, "end_record")) | _read_keys(_function(tree, "final_state")),
        "error": _read_keys(_function(tree, "first_failure")),
        "stall": _read_keys(_function(watch, "__init__")),
        "restarts": _read_keys(_function(tree, "_restart_policy")),
        "progress": _read_keys(_function(watch, "_read"))
        | _read_keys(check)
        | _read_keys(_function(watch, "carry_warning")),
        "stalled": set().union(*_dicts(check), *_dicts(phase)),
    }


SUPERVISOR_TYPES = {
    "status": StatusFile,
    "identity": ProcessIdentity,
    "stop": StopRequest,
    "end": EndRecord,
    "error": ErrorRecord,
    "stall": StallSettings,
    "restarts": RestartSettings,
    "progress": Progress,
    "stalled": Stalled,
}


def unknown_supervisor_keys(source: str) -> dict[str, set[str]]:
    def fields(t) -> set[str]:
        return set(t.model_fields) if hasattr(t, "model_fields") else typed_keys(t)

    found = supervisor_keys(source)
    return {kind: found[kind] - fields(t) for kind, t in SUPERVISOR_TYPES.items() if found[kind] - fields(t)}


def test_supervisor_reads_and_writes_only_keys_of_the_contract():
    found = supervisor_keys(SUPERVISOR)
    assert {"state", "started_at", "ended_at", "exit_code", "error", "supervisor", "launcher", "argv"} <= found[
        "status"
    ]
    assert found["identity"] == {"pid", "create_time", "since_boot", "boot_id", "pgid"} and found["stop"] == {"grace_s"}
    assert {"event", "status"} <= found["end"] and {"rank", "time", "error", "traceback"} == found["error"]
    assert (
        found["stall"] == {"after_s"}
        and found["progress"] == {"step", "micro", "forwards", "time", "saving", "warning"}
        and {"stalled", "warning"} <= found["status"]
    )
    assert found["stalled"] == {"step", "since", "limit_s", "phase"}
    assert found["restarts"] == {"max", "backoff_s"} and {"attempts", "restarting", "failure"} <= found["status"]
    assert unknown_supervisor_keys(SUPERVISOR) == {}


def test_the_readers_check_processes_by_the_identity_the_supervisor_writes():
    tree = ast.parse(Path(inspect.getsourcefile(run_status)).read_text(encoding="utf-8"))
    read = _read_keys(_function(ast.parse(SUPERVISOR), "is_alive")) | _read_keys(_function(tree, "start_on_the_clock"))
    assert read == {"pid", "create_time", "since_boot", "boot_id"} <= supervisor_keys(SUPERVISOR)["identity"]


def test_a_key_renamed_in_the_supervisor_alone_fails_the_contract():
    assert unknown_supervisor_keys(SUPERVISOR.replace('["grace_s"]', '["grace"]')) == {"stop": {"grace"}}
    assert unknown_supervisor_keys(SUPERVISOR.replace("started_at=started_at", "began_at=started_at")) == {
        "status": {"began_at"}
    }
    assert unknown_supervisor_keys(SUPERVISOR.replace('get("traceback")', 'get("trace")')) == {"error": {"trace"}}


def test_supervisor_states_are_the_contracts():
    tree = ast.parse(SUPERVISOR)
    written = {_str(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "state"}
    ended = {
        _str(c)
        for r in ast.walk(_function(tree, "final_state"))
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)
        for c in ast.walk(r.value.elts[0])
        if _str(c)
    }
    assert written - {None} <= set(run_folder.STATES) and ended == {"finished", "stopped", "failed"}


# ---------------------------------------------------------------- the readers


def test_the_panel_draws_only_log_record_fields():
    drawn = {key for key, _ in charts.METRIC_PANELS}
    tree = ast.parse(Path(inspect.getsourcefile(charts)).read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "series"]
    drawn |= {_str(call.args[1]) for call in calls if _str(call.args[1])}  # series(records, "loss")
    assert {"loss", "eval_loss", "learning_rate"} <= drawn <= typed_keys(LogRecord)


def test_a_damaged_metrics_file_gives_typed_records_and_loses_only_what_is_damaged(tmp_path):
    lines = [
        json.dumps({"event": "start", "world_size": 2, "nodes": ["n0", 7], "trainable_params": 10, "total_params": 40}),
        "not json",
        "[1, 2]",
        json.dumps({"event": "log", "step": "four", "loss": 1.0}),  # no step to place it at: skipped
        json.dumps({"event": "log", "step": 1, "max_steps": 2, "loss": "high", "learning_rate": 1e-4, "extra": 1}),
        json.dumps({"event": "log", "step": 2, "max_steps": 2, "loss": 0.5, "gpu_peak_allocated_gb": [1.5, True]}),
        json.dumps({"event": "end", "status": "finished", "runtime_s": 3}),
        '{"event": "log", "step": 3, "lo',  # the trainer was cut mid-line
    ]
    (tmp_path / run_folder.METRICS_FILE).write_text("\n".join(lines))
    run = read_records(tmp_path)
    assert run.start == {"event": "start", "world_size": 2, "trainable_params": 10, "total_params": 40}
    assert run.records == [
        {"event": "log", "step": 1, "max_steps": 2, "learning_rate": 1e-4},
        {"event": "log", "step": 2, "max_steps": 2, "loss": 0.5},
    ]
    assert run.end == {"event": "end", "status": "finished", "runtime_s": 3.0}


def test_a_new_status_file_is_one_the_readers_accept(tmp_path):
    status = run_folder.queued_status(
        "20250101-120000-000001", "m · lora · ddp · 2xCPU", ["accelerate", "launch"], None, {}
    )
    supervisor.write_status(tmp_path, status)
    assert run_folder.read_status_file(tmp_path)["state"] == "queued"
    assert set(status) <= set(StatusFile.model_fields) and "supervisor" not in status
    run_folder.write_stop_request(tmp_path, 12.5)
    assert supervisor._grace_seconds(tmp_path / supervisor.STOP_FILE) == 12.5


@pytest.mark.parametrize("name", ["STATUS_FILE", "METRICS_FILE", "ERRORS_FILE", "LAUNCHER_LOG"])
def test_contract_names_are_relative_paths_inside_the_run_folder(name):
    path = Path(getattr(run_folder, name))
    assert not path.is_absolute() and ".." not in path.parts
