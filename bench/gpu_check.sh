#!/usr/bin/env bash
# What only a GPU can show, in one short run (about 10 minutes on one H200):
#   1. the NVML monitor's real code path (backend/monitor.py) reads the GPU and sees memory move;
#   2. measured peak memory of real LoRA / full training steps vs tunedeck's estimate;
#   3. a real tunedeck run on the GPU: the demo in bf16 (LoRA), in 4-bit (QLoRA, bitsandbytes) and
#      under FSDP2 (the final adapter must be saved; every log record must carry MFU and HFU against
#      the GPU's peak from backend/flops.py's table, which names this GPU);
#      DPO with a full fine-tune under ZeRO-3 (its reference model beside the trained one, then scored before
#      training instead), KTO on QLoRA, GRPO on QLoRA (answers written on the GPU from a 4-bit base);
#   4. the smoke run (`tunedeck train PRESET --smoke`) of every preset that fits the GPUs found, with
#      its load and training peaks beside the estimate (bench/gpu_smoke_check.py).
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
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
failed=0
step() { echo "== $1"; shift; "$@" || failed=1; }

step "NVML monitor (real pynvml)" python3 bench/gpu_check_nvml.py
step "peak memory: measured vs estimated" python3 bench/gpu_peak_check.py --out "$out/peaks.json"
step "demo assets" python3 -m tunedeck.backend.demo
for variant in bf16 qlora fsdp; do
  case $variant in
    bf16) extra=() ;;
    qlora) extra=(--set method=qlora --set quantization.bits=4 --set quantization.bnb_4bit_compute_dtype=bfloat16) ;;
    # FSDP2 on one GPU: checks that the final adapter is gathered and saved (sharded checkpoints otherwise).
    fsdp) extra=(--set strategy.kind=fsdp) ;;
  esac
  step "tunedeck train demo on the GPU ($variant)" timeout 300 python3 -m tunedeck.backend.cli train demo \
    --runs-dir "$out/runs-$variant" --set launch.use_cpu=false --set launch.num_processes=1 \
    --set training.precision=bf16 --set model.dtype=bfloat16 --set training.max_steps=20 "${extra[@]}"
  python3 bench/gpu_run_report.py "$out/runs-$variant" || failed=1
done
# Full DPO under ZeRO-3: the frozen reference copy loads and is wrapped by DeepSpeed beside the trained model.
step "tunedeck train demo-dpo on the GPU (full, ZeRO-3)" timeout 300 python3 -m tunedeck.backend.cli train demo-dpo \
  --runs-dir "$out/runs-dpo" --set launch.use_cpu=false --set launch.num_processes=1 --set training.precision=bf16 \
  --set model.dtype=bfloat16 --set training.max_steps=20 --set method=full --set strategy.kind=zero3
python3 bench/gpu_run_report.py "$out/runs-dpo" || failed=1
# The same with the reference's scores computed before training: no copy, peaks below the run above.
step "tunedeck train demo-dpo on the GPU (full, ZeRO-3, reference scored before training)" timeout 300 \
  python3 -m tunedeck.backend.cli train demo-dpo --runs-dir "$out/runs-dpo-precomputed" --set launch.use_cpu=false \
  --set launch.num_processes=1 --set training.precision=bf16 --set model.dtype=bfloat16 --set training.max_steps=20 \
  --set method=full --set strategy.kind=zero3 --set preference.precompute_ref_log_probs=true
python3 bench/gpu_run_report.py "$out/runs-dpo-precomputed" || failed=1
# KTO on a 4-bit base: the reference is the base with the adapters off, and a KL answer runs through both.
step "tunedeck train demo-kto on the GPU (QLoRA)" timeout 300 python3 -m tunedeck.backend.cli train demo-kto \
  --runs-dir "$out/runs-kto" --set launch.use_cpu=false --set launch.num_processes=1 --set training.precision=bf16 \
  --set model.dtype=bfloat16 --set training.max_steps=20 --set method=qlora --set quantization.bits=4 \
  --set quantization.bnb_4bit_compute_dtype=bfloat16
python3 bench/gpu_run_report.py "$out/runs-kto" || failed=1
# GRPO on a 4-bit base: the model writes 8 answers a question on the GPU (generate through bitsandbytes), rewards
# score them; one process writes the 32 answers of a step.
step "tunedeck train demo-grpo on the GPU (QLoRA)" timeout 300 python3 -m tunedeck.backend.cli train demo-grpo \
  --runs-dir "$out/runs-grpo" --set launch.use_cpu=false --set launch.num_processes=1 --set training.precision=bf16 \
  --set model.dtype=bfloat16 --set training.max_steps=20 --set method=qlora --set quantization.bits=4 \
  --set quantization.bnb_4bit_compute_dtype=bfloat16
python3 bench/gpu_run_report.py "$out/runs-grpo" || failed=1
step "smoke run of every preset, peaks vs estimate" python3 bench/gpu_smoke_check.py --out "$out/smoke.json" \
  --runs-dir "$out/runs-smoke"
[ $failed = 0 ] && echo "ALL PASS" || echo "SOME CHECKS FAILED"
exit $failed
