"""After a GPU run: print what the start record says it got and the measured peaks; PASS if it finished
on CUDA and saved its adapter."""

import json
import sys
from pathlib import Path


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
    saved = any(runs[-1].parent.glob("output/adapter_model.safetensors"))
    ok = end.get("status") == "finished" and bool(peaks) and saved
    print(
        ("PASS" if ok else "FAIL")
        + f" run: status {end.get('status')}, GPU peaks recorded: {bool(peaks)}, adapter saved: {saved}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
