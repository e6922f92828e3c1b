"""The network measured before the model loads (issue 35, part 3; backend/recipe/network.py), on a real 2-rank demo
run over gloo: the start record holds the all-reduce sweep's bus bandwidth, and the sweep stays within its budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunedeck.backend.recipe.network import bus_bandwidth, wanted
from tunedeck.backend.runs import read_records
from tunedeck.backend.runs.manager import RunManager

from .helpers import logs_tail


def test_bus_bandwidth_is_nccl_tests_and_the_check_is_on_for_several_machines():
    assert bus_bandwidth(2**30, 1.0, 8) == pytest.approx(2**30 / 1e9 * 2 * 7 / 8)
    assert wanted({"launch": {"num_machines": 2}}) and not wanted({"launch": {"num_machines": 1}})
    assert wanted({"launch": {"num_machines": 1, "network_check": True}})
    assert not wanted({"launch": {"num_machines": 4, "network_check": False}})


def test_the_measured_bandwidth_is_said_beside_the_link_the_estimate_assumed():
    from tunedeck.backend.runs import network_line

    two_machines = {"network": {"ranks": 16, "machines": 2, "all_ranks_gbps": 9.0, "within_machine_gbps": 180.0}}
    assert network_line({**two_machines, "gpu_name": "NVIDIA H100 80GB HBM3"}) == (
        "measured 9.0 GB/s between machines; the estimate assumed HDR InfiniBand (20 GB/s): communication will take "
        "about 2.2x longer than predicted · 180.0 GB/s within a machine"
    )
    fast = {"network": {"ranks": 16, "machines": 2, "all_ranks_gbps": 19.0}}
    assert network_line(fast).endswith("the estimate assumed HDR InfiniBand (20 GB/s)")  # as assumed: nothing more
    assert network_line({}) is None and network_line({"network": None}) is None


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_run_records_the_bandwidth_it_measured_before_loading_the_model(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({"training.max_steps": 2, "launch.network_check": True}))
    status = manager.wait(run_id, timeout=240)
    assert status.state == "finished", logs_tail(manager.run_dir(run_id))
    network = read_records(manager.run_dir(run_id)).start["network"]
    assert (network["ranks"], network["machines"], network["backend"]) == (2, 1, "gloo")
    sizes = [m["size_mb"] for m in network["all_ranks"]]
    assert sizes == [1, 4, 16, 64][: len(sizes)] and sizes, network
    assert network["all_ranks_gbps"] == network["all_ranks"][-1]["bus_gbps"] > 0
    assert network["seconds"] < 10, network
    print(
        f"2 gloo ranks: {network['all_ranks_gbps']:.2f} GB/s bus bandwidth at {sizes[-1]} MiB, {network['seconds']} s"
    )


SKEWED_CLOCKS = """
import sys, time
import torch.distributed as dist
from tunedeck.backend.recipe import network

dist.init_process_group("gloo")
if dist.get_rank() == 1:  # this rank's clock runs 20 times fast: it would stop repeating long before rank 0
    real = time.perf_counter
    network.time = type("Clock", (), {"perf_counter": staticmethod(lambda: real() * 20), "monotonic": time.monotonic})
record = network.measure_network({"launch": {"network_check": True}}, ["vm", "vm"])
print("measured", dist.get_rank(), [m["size_mb"] for m in record["all_ranks"]], flush=True)
dist.destroy_process_group()
"""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_ranks_whose_clocks_disagree_repeat_each_all_reduce_as_often(tmp_path):
    """Each rank counted its repeats by its own clock: on 2 Slurm nodes the counts differed and both ranks waited for
    ever (one in a broadcast, one in an all-reduce). Rank 0's count is every rank's now."""
    import subprocess
    import sys

    script = tmp_path / "skewed.py"
    script.write_text(SKEWED_CLOCKS)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("measured") == 2, done.stdout
