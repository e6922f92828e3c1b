"""launch.env for real: a run started here gets the job's variables, and its start record says so."""

from __future__ import annotations

import pytest

from tunedeck.backend.spec import resolve_spec

from .helpers import start_record
from .test_training_runs import assert_finished, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_ranks_run_with_the_jobs_environment(runs_dir):
    """Rank 0 records what it saw; the launcher hands every rank the same environment."""
    probe = "a b,c $HOME 'q'"  # spaces, a comma, a dollar sign and quotes arrive as typed
    spec = resolve_spec("demo", ["training.max_steps=2", f"launch.env=TUNEDECK_PROBE={probe}, NCCL_DEBUG=WARN"])
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    start = start_record(manager.run_dir(run_id))
    assert start["environment"] == {"TUNEDECK_PROBE": probe, "NCCL_DEBUG": "WARN"}
    assert start["gate"]["passed"] and start["world_size"] == 2
