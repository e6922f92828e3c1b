"""After a GPU run: print what the start record says it got and the measured peaks; PASS if it finished
on CUDA, saved its adapter (or its model), and logged MFU against the GPU's peak from the table (backend/spec/flops.py)."""

import json
import sys
from pathlib import Path

from tunedeck.backend.runs.startup import breakdown, read_phases


def main(runs_dir: str) -> int:
    runs = sorted(Path(runs_dir).glob("*/metrics.jsonl"))
    if not runs:
        print(f"FAIL run: no metrics.jsonl under {runs_dir}")
        return 1
    records = [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]
    start = next((r for r in records if r.get("event") == "start"), {})
    logs = [r for r in records if r.get("event") == "log" and "loss" in r]
    end = next((r for r in records if r.get("event") == "end"), {})
    peaks = [r.get("gpu_peak_allocated_gb") for r in logs if r.get("gpu_peak_allocated_gb")]
    print(f"  start: {json.dumps(start)}")
    if logs:
        print(
            f"  loss {logs[0]['loss']:.3f} -> {logs[-1]['loss']:.3f} over {len(logs)} logs; peak allocated per rank: {peaks[-1] if peaks else None} GiB"
        )
        if "reward" in logs[0]:  # GRPO: what its answers scored
            print(
                f"  reward {logs[0]['reward']:.3f} -> {logs[-1]['reward']:.3f}; rewards at the end: {logs[-1]['rewards']}"
            )
    print(f"  before step 1: {breakdown(read_phases(runs[-1].parent))}")  # the model's load on this GPU machine
    saved = any(runs[-1].parent.glob("output/adapter_model.safetensors")) or any(
        runs[-1].parent.glob("output/model*.safetensors")  # a full fine-tune saves the whole model
    )
    mfu_ok = mfu_logged(start, logs)
    ok = end.get("status") == "finished" and bool(peaks) and saved and mfu_ok
    print(
        ("PASS" if ok else "FAIL")
        + f" run: status {end.get('status')}, GPU peaks recorded: {bool(peaks)}, adapter saved: {saved}, "
        f"MFU logged against a known peak: {mfu_ok}"
    )
    return 0 if ok else 1


def mfu_logged(start: dict, logs: list[dict]) -> bool:
    """Every training log carries 0 < mfu <= hfu < 1 against the peak the table gives for this GPU."""
    mfu = [r.get("mfu") for r in logs]
    print(
        f"  GPU {start.get('gpu_name')!r}, {start.get('compute_dtype')}: peak {start.get('peak_tflops')} TFLOPS "
        f"({start.get('peak_source') or start.get('mfu_note')}); MFU per log: {[round(m, 5) for m in mfu if m]}"
    )
    if not start.get("peak_tflops") or not logs:
        return False
    return all(m is not None and 0 < m <= r.get("hfu", 0) < 1 for m, r in zip(mfu, logs))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
