#!/usr/bin/env bash
# What only a GPU can show, in one short run (a lent H200 gives 15 minutes in all, its start included):
#   1. the NVML monitor's real code path (backend/machine/monitor.py) reads the GPU and sees memory move;
#   2. a real tunedeck run of the demo in bf16 (LoRA) alone on the GPU: its tokens/s and MFU/HFU against the
#      GPU's peak from backend/spec/flops.py's table, which names this GPU;
#   3. side by side (each its own process, runs folder and rendezvous port; the peaks are per process):
#      measured peak memory of real LoRA / full training steps vs tunedeck's estimate; the demo in 4-bit
#      (QLoRA, bitsandbytes) and under FSDP2 (the final adapter must be saved); DPO with a full fine-tune
#      under ZeRO-3 (its reference model beside the trained one, then scored before training instead),
#      KTO on QLoRA, GRPO on QLoRA (answers written on the GPU from a 4-bit base); and the smoke run
#      (`tunedeck train PRESET --smoke`) of every preset that fits the GPUs found, with its load and
#      training peaks beside the estimate (bench/gpu_smoke_check.py).
# Needs torch with CUDA, transformers, accelerate, peft. Packages the machine lacks travel as
# wheels in .whl/ (bash bench/fetch_gpu_wheels.sh fetches them) and are installed to /tmp/site.
# Prints one line per check, "PASS ..." or "FAIL ...", and exits non-zero if any failed.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TUNEDECK_HOME=${TUNEDECK_HOME:-/tmp/tunedeck-home}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "FAIL installing the carried wheels"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
# Run from this checkout without installing it: the repository root is the `tunedeck` package.
src=$(mktemp -d /tmp/tunedeck-src.XXXXXX)
ln -s "$PWD" "$src/tunedeck"
export PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH}
out=${GPU_CHECK_OUT:-/tmp/gpu-check}
mkdir -p "$out/logs"
failed=0
step() { echo "== $1"; shift; "$@" || failed=1; }
on_gpu=(--set launch.use_cpu=false --set launch.num_processes=1 --set training.precision=bf16
  --set model.dtype=bfloat16 --set training.max_steps=20)
qlora=(--set method=qlora --set quantization.bits=4 --set quantization.bnb_4bit_compute_dtype=bfloat16)
# One GPU run and its report, into $out/logs/NAME.log: NAME PRESET [--set ...]
gpu_run() {
  local name=$1 preset=$2
  shift 2
  {
    echo "== tunedeck train $preset on the GPU ($name)"
    timeout 400 python3 -m tunedeck.backend.cli train "$preset" --runs-dir "$out/runs-$name" "${on_gpu[@]}" "$@" \
      2>&1 | tail -n 15
    python3 bench/gpu_run_report.py "$out/runs-$name"
  } >"$out/logs/$name.log" 2>&1
}

step "NVML monitor (real pynvml)" python3 bench/gpu_check_nvml.py
step "demo assets" python3 -m tunedeck.backend.data.demo
step "demo (bf16) alone on the GPU" gpu_run bf16 demo
cat "$out/logs/bf16.log"

echo "== side by side: peaks, QLoRA, FSDP2, DPO, KTO, GRPO, every preset's smoke run"
pids=()
python3 bench/gpu_peak_check.py --out "$out/peaks.json" >"$out/logs/peaks.log" 2>&1 & pids+=($!)
gpu_run qlora demo "${qlora[@]}" & pids+=($!)
# FSDP2 on one GPU: checks that the final adapter is gathered and saved (sharded checkpoints otherwise).
gpu_run fsdp demo --set strategy.kind=fsdp & pids+=($!)
# Full DPO under ZeRO-3: the frozen reference copy loads and is wrapped by DeepSpeed beside the trained model;
# then the same with the reference's scores computed before training: no copy, peaks below the run above.
gpu_run dpo demo-dpo --set method=full --set strategy.kind=zero3 & pids+=($!)
gpu_run dpo-precomputed demo-dpo --set method=full --set strategy.kind=zero3 \
  --set preference.precompute_ref_log_probs=true & pids+=($!)
# KTO on a 4-bit base: the reference is the base with the adapters off, and a KL answer runs through both.
gpu_run kto demo-kto "${qlora[@]}" & pids+=($!)
# GRPO on a 4-bit base: the model writes 8 answers a question on the GPU (generate through bitsandbytes).
gpu_run grpo demo-grpo "${qlora[@]}" & pids+=($!)
python3 bench/gpu_smoke_check.py --out "$out/smoke.json" --runs-dir "$out/runs-smoke" >"$out/logs/smoke.log" 2>&1 &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
for name in peaks qlora fsdp dpo dpo-precomputed kto grpo smoke; do cat "$out/logs/$name.log"; done
grep -h "^FAIL" "$out"/logs/*.log >/dev/null && failed=1
[ $failed = 0 ] && echo "ALL PASS" || echo "SOME CHECKS FAILED"
exit $failed
