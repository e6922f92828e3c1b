"""The load phase of the memory model matches what the installed libraries do, on two real ranks.

tests/estimate/load_probe.py loads the demo model under torchrun (2 ranks, gloo) with each
strategy's settings; each test checks one fact backend/estimate/memory_load.py relies on, and the
estimate that follows from it. When a library changes its loading, a test here fails and
names the branch of memory_load.py to revisit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import GIB, Job, frozen_base_params, input_values, quant_stats_bytes
from tunedeck.backend.spec import set_paths

PROBE = Path(__file__).with_name("load_probe.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # two real ranks under torchrun


@pytest.fixture(scope="module")
def loaded(demo_home, tmp_path_factory) -> dict[str, list[dict]]:
    """{case: [report of rank 0, report of rank 1]} from one two-rank launch."""
    out = tmp_path_factory.mktemp("load_probe")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", str(PROBE), str(demo_home / "model"), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    reports: dict[str, list[dict]] = {}
    for rank in (0, 1):
        for line in (out / f"rank{rank}.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            reports.setdefault(record["case"], []).append(record)
    return reports


def demo(demo_spec, **settings):
    return demo_spec({"launch.num_processes": 2, "launch.num_machines": 1, **settings})


def test_zero3_shards_16bit_weights_as_they_load(loaded, demo_spec):
    for rank in loaded["zero3-16bit"]:  # deepspeed.zero.Init: every parameter partitioned, none held whole
        assert rank["zero_init"] and rank["local_numel"] < rank["numel"], rank
    spec = demo(demo_spec, **{"strategy.kind": "zero3"})
    est, job = estimate(spec), Job.from_values(input_values(spec))
    whole = job.arch.num_parameters * job.weight_bytes / GIB
    assert est.load_breakdown["weights"] == pytest.approx(whole / 2)
    assert est.load_cpu_gb == pytest.approx(whole)  # rank 0 alone reads the checkpoint


@pytest.mark.parametrize("case,kind", [("zero3-4bit", "zero3"), ("fsdp-4bit", "fsdp")])
def test_quantized_models_load_whole_on_every_rank(loaded, demo_spec, case, kind):
    ranks = loaded[case]
    for rank in ranks:  # no zero.Init for bitsandbytes models: each rank quantizes all of it
        assert not rank["zero_init"] and rank["quantized"] > 0 and rank["local_numel"] == rank["numel"], rank
    assert ranks[0]["numel"] == ranks[1]["numel"]
    spec = demo(demo_spec, **{"strategy.kind": kind, "method": "qlora", "quantization.bits": 4,
                              "quantization.bnb_4bit_quant_storage": "float32"})  # fmt: skip
    job = Job.from_values(input_values(spec))
    whole = (frozen_base_params(job) + quant_stats_bytes(job)) / GIB
    for world in (2, 8):
        est = estimate(set_paths(spec, {"launch.num_processes": world}))
        assert est.load_breakdown["weights"] == pytest.approx(whole)  # whatever the number of GPUs


def test_fsdp_ram_efficient_loading_still_reads_the_model_on_every_rank(loaded, demo_spec):
    for rank in loaded["fsdp-16bit-ram-efficient"]:  # not "meta" on rank 1: transformers 5 reads it everywhere
        assert rank["devices"] == ["cpu"] and rank["local_numel"] == rank["numel"], rank
    spec = demo(demo_spec, **{"strategy.kind": "fsdp", "strategy.fsdp_cpu_ram_efficient_loading": True})
    est, job = estimate(spec), Job.from_values(input_values(spec))
    assert est.load_cpu_gb == pytest.approx(2 * job.arch.num_parameters * job.weight_bytes / GIB)
