"""GPU check 1: the monitor's real NVML path reads every GPU and sees an allocation appear."""

import sys
import time

from tunedeck.backend.machine.monitor import Monitor


def main() -> int:
    monitor = Monitor(interval_s=0.5)
    if monitor.gpu_error:
        print(f"FAIL nvml: {monitor.gpu_error}")
        return 1
    before = monitor.sample_once()
    for gpu in before.gpus:
        print(
            f"  GPU {gpu.index} {gpu.name}: util {gpu.utilization_pct}% mem {gpu.memory_used_mb:.0f}/"
            f"{gpu.memory_total_mb:.0f} MiB temp {gpu.temperature_c} C power {gpu.power_w}/{gpu.power_limit_w} W"
        )
    import torch

    block = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")  # 4 GiB the driver must see
    block.fill_(1)
    torch.cuda.synchronize()
    monitor.start()
    time.sleep(2.0)
    after = monitor.latest()
    history = monitor.history()
    monitor.stop()
    grew_mb = after.gpus[0].memory_used_mb - before.gpus[0].memory_used_mb
    pids = [p.pid for p in after.gpus[0].processes]
    print(f"  after a 4 GiB allocation: +{grew_mb:.0f} MiB; processes listed by NVML: {pids}; samples: {len(history)}")
    ok = grew_mb >= 4000 and len(history) >= 3 and monitor.total_gpu_memory_gb() > 10
    print(("PASS" if ok else "FAIL") + f" nvml: {len(before.gpus)} GPU(s), allocation seen: {grew_mb >= 4000}")
    return (0 if ok else 1) | helpers_agree(before) | speed_on_this_gpu()


def helpers_agree(sample) -> int:
    """Start's GPU list and the Try/Evaluate placement read NVML through backend/machine/nvml.py: the same GPUs and
    memory the monitor reads, while the monitor holds its own NVML session open (each shuts down only its own)."""
    from tunedeck.backend.after.worker_device import _free_gb
    from tunedeck.backend.machine.nvml import gpu_memory
    from tunedeck.backend.runs.preflight import gpu_indices

    indices, memory, free = gpu_indices(), gpu_memory(), _free_gb(None)
    totals = [round(g.total_gb * 1024) for g in memory]
    print(f"  helpers: GPUs {indices}, total MiB {totals}, free GiB {[round(f, 1) for f in free.values()]}")
    ok = (
        indices == [g.index for g in sample.gpus]
        and totals == [round(g.memory_total_mb) for g in sample.gpus]
        and sorted(free) == indices
        and all(0 < f <= g.total_gb for f, g in zip(free.values(), memory))
    )
    print(("PASS" if ok else "FAIL") + f" nvml helpers: {len(indices)} GPU(s), the monitor's")
    return 0 if ok else 1


def speed_on_this_gpu() -> int:
    """The estimate's GPU comes from NVML: the CLI's and the page's (backend/estimate/hardware.py's gpu_name)."""
    from tunedeck.app.estimate_panel import EstimatePanel
    from tunedeck.app.registry import Registry

    panel = EstimatePanel(Registry(), monitor=None)  # its machine facts are backend/estimate/hardware.py's, from NVML
    name = panel.machine.gpu_name
    hardware = panel.hardware(panel.own_gpu_text)
    print(f"  NVML name {name!r}: the page predicts speed on {hardware.gpu} ({hardware.source or 'NVML'})")
    ok = name is not None and hardware.gpu is not None and hardware.source != "assumed"
    print(("PASS" if ok else "FAIL") + f" speed on this GPU: {hardware.gpu}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
