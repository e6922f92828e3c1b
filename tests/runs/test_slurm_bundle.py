"""An exported bundle submitted the way Slurm runs it: slurm.sbatch on a 2-node allocation.

Slurm itself cannot exist on this machine, so `srun` and `scontrol` are stand-ins that do
what they do on a cluster (srun: the command once per node, with SLURM_NODEID; scontrol:
the allocation's host names). Everything under them is real: launch.sh on each "node",
two `accelerate launch` processes rendezvousing over loopback, one rank each.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import end_record, log_records, logs_tail, start_record

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # two accelerate launch "nodes"

SRUN = """#!/usr/bin/env bash
# stand-in for srun: run the last argument with bash once per node, in parallel, like srun -N,
# with the node's id and name (slurmd exports SLURMD_NODENAME; the sanity gate counts machines by it).
IFS=, read -ra names <<< "$SLURM_JOB_NODELIST"
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
  SLURM_NODEID=$node SLURM_PROCID=$node SLURMD_NODENAME=${names[$node]} bash -c "${@: -1}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""

SCONTROL = """#!/usr/bin/env bash
# stand-in for `scontrol show hostnames`: the allocation's first node is this machine.
[ "$1 $2" = "show hostnames" ] && printf '127.0.0.1\\nnode-b\\n'
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sbatch_runs_launch_sh_once_per_node_as_one_job(tmp_path, demo_spec):
    from tunedeck.backend.render import render_bundle, write_bundle

    spec = demo_spec(
        {
            "training.max_steps": 3,
            "launch.num_machines": 2,
            "launch.num_processes": 2,
            "launch.main_process_ip": "10.9.9.9",  # what the form said; Slurm's first host must win
            "launch.main_process_port": free_port(),
        }
    )
    bundle = tmp_path / "bundle"
    write_bundle(render_bundle(spec), bundle)
    sbatch = (bundle / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert "--gpus-per-node" not in sbatch  # a CPU job asks for no GPUs

    stand_ins = tmp_path / "slurm-bin"
    stand_ins.mkdir()
    for name, text in {"srun": SRUN, "scontrol": SCONTROL}.items():
        (stand_ins / name).write_text(text)
        (stand_ins / name).chmod(0o755)
    env = {
        "PATH": f"{stand_ins}:{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "SLURM_SUBMIT_DIR": str(bundle),
        "SLURM_JOB_NODELIST": "127.0.0.1,node-b",
        "SLURM_NNODES": "2",
    }
    # sbatch runs its copy of the script from elsewhere: the spool folder, here tmp_path.
    spooled = tmp_path / "spooled.sbatch"
    spooled.write_text(sbatch)
    result = subprocess.run(["bash", str(spooled)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs_tail(bundle)

    start = start_record(bundle)  # one start record: only global rank 0 writes metrics
    assert start["world_size"] == 2 and start["model_class"] == "DistributedDataParallel"
    assert start["nodes"] == ["127.0.0.1", "node-b"] and start["gate"]["passed"]  # one rank on each node
    assert end_record(bundle)["status"] == "finished"
    assert len(log_records(bundle)) == 3
    assert {p.name for p in (bundle / "logs").glob("rank*.log")} == {"rank0.log", "rank1.log"}
