#!/usr/bin/env bash
# One entry point for a fresh checkout with only Python 3.11:
#   bash dev.sh demo       set up .venv, build the demo model/data, open the panel on the demo preset
#   bash dev.sh test       set up .venv (and Chromium for the browser tests), lint, run the whole test suite
#   bash dev.sh test-fast  lint, then every test but the multi-process runs, the browser and the slow (2 minutes)
#   bash dev.sh lint       ruff check, ruff format --check (`.venv/bin/ruff format .` fixes the format), the type checker
#                          (basedpyright, basic mode), mkdocs build --strict
# Extra arguments go to the panel (demo) or to pytest (test, test-fast).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

step() {
  # One line per install step; pip's own output (and the warnings of a machine's pip configuration, such as
  # index locations that do not exist) goes to .venv/install.log, printed whole only if the step fails.
  local what=$1
  shift
  echo "==> $what"
  "$@" >>.venv/install.log 2>&1 || { cat .venv/install.log >&2; echo "dev.sh: $what failed (above)" >&2; return 1; }
}

setup_venv() {
  local stamp=.venv/.tunedeck-installed want
  want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    : >.venv/install.log
    step "upgrading pip in .venv" .venv/bin/python -m pip install -q --upgrade pip
    # torch first: on a CPU machine this takes the CPU build; otherwise deepspeed/peft pull a CUDA one.
    step "installing torch 2.13.0" .venv/bin/python -m pip install -q torch==2.13.0
    step "installing tunedeck and its training stack (about 2 minutes)" \
      .venv/bin/python -m pip install -q -c constraints.txt -e ".[train,test]"
    echo "$want" >"$stamp"
  fi
}

setup_chromium() {
  # The browser tests drive Debian's chromium; Playwright cannot download its own browser here.
  command -v chromium >/dev/null && return
  echo "==> installing Debian's chromium for the browser tests"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium fonts-dejavu-core >/dev/null
}

setup_axe() {
  # The browser tests run axe-core in the page (tests/panel/test_browser_a11y.py), from the npm registry, into a
  # git-ignored folder; the version is pinned so a new rule never fails a run that changed nothing.
  local want=4.14.1 have
  have=$(node -p "require('./tests/panel/node_modules/axe-core/package.json').version" 2>/dev/null || true)
  [ "$have" = "$want" ] && return
  if ! command -v npm >/dev/null; then
    echo "==> npm is missing: the accessibility browser test will fail until axe-core is in tests/panel/node_modules" >&2
    return 0
  fi
  echo "==> installing axe-core $want for the browser tests"
  npm install --silent --no-save --no-package-lock --no-audit --no-fund --prefix tests/panel "axe-core@$want"
}

setup_slurm() {
  # The slurm tests start a real 2-node cluster on this machine (tests/slurm/local_cluster.py) from Debian's packages.
  PATH="$PATH:/usr/sbin:/sbin" command -v slurmctld >/dev/null && command -v sbatch >/dev/null && return
  [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null || return 0  # the slurm tests then skip, saying why
  echo "==> installing Debian's Slurm and munge for the slurm tests"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null
}

setup_go() {
  # tests/after/test_gguf_export.py renders the Ollama Modelfile's TEMPLATE with Go's text/template (Ollama's engine).
  command -v go >/dev/null && return
  [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null || return 0  # that test then fails, saying go is missing
  echo "==> installing Debian's Go for the Modelfile test"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q golang-go >/dev/null
}

install_export() {
  # GGUF export's extra (backend/after/gguf_tools.py): llama-cpp-python has no wheel on PyPI, so pip compiles
  # llama.cpp: the CPU library alone here, without its multimodal library (LLAVA_BUILD). pip keeps the wheel it
  # built, so a second install takes seconds. Then llama.cpp's converter, from the same version's sources on PyPI.
  local stamp=.venv/.tunedeck-export-installed want
  want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      .venv/bin/python -m pip install -q -c constraints.txt -e ".[export]"
    echo "$want" >"$stamp"
  fi
  .venv/bin/tunedeck export-gguf --fetch-converter
}

build_deepspeed_ops() {
  # DeepSpeed compiles its CPU ops at first use, into the folder backend/runs/launch.py gives DeepSpeed runs
  # (TORCH_EXTENSIONS_DIR): shm_comm in every CPU run (a 2-rank ZeRO-3 test run: 85 s cold, 19 s warm), cpu_adam for an
  # offloaded optimizer (100 s). Built once here, beside the lint and the first lane, in the ranks' own environment
  # (rank_env puts .venv/bin's ninja first on PATH: built by another ninja, the first run would build them again).
  # A machine with a GPU builds none: its runs use the CUDA ops, built by their first run.
  .venv/bin/python - <<'EOF'
import os

import torch

if not torch.cuda.is_available():
    from tunedeck.backend.runs.launch import rank_env
    from tunedeck.backend.spec import resolve_spec, set_paths

    os.environ.update(rank_env(set_paths(resolve_spec("demo"), {"strategy.kind": "zero2"}), None))
    from deepspeed.accelerator import get_accelerator

    for name in ("ShareMemCommBuilder", "CPUAdamBuilder"):
        get_accelerator().create_op_builder(name).load()
EOF
}

lint() {
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  # The type checker ([tool.basedpyright] in pyproject.toml: app/ and backend/, basic mode, 0 errors). The repository
  # root is the package `tunedeck` (installed by a finder that pyright cannot read): .venv/typecheck/tunedeck links
  # to it, so that `import tunedeck.backend...` resolves to the files being checked.
  mkdir -p .venv/typecheck
  ln -sfn ../.. .venv/typecheck/tunedeck
  .venv/bin/basedpyright --project pyproject.toml  # this file, not a pyrightconfig.json in a folder above
  # The guides (mkdocs.yml): --strict fails on a broken link or anchor or a page left out of the nav. Each build
  # writes to a folder of its own, so that two lints at once in one checkout do not clean each other's output;
  # its INFO lines are shown only when it fails. NO_MKDOCS_2_WARNING: mkdocs-material's end-of-life banner.
  local site out rc=0
  site=$(mktemp -d)
  out=$(NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site" 2>&1) || rc=$?
  rm -rf "$site"
  if [ "$rc" != 0 ]; then
    echo "$out" >&2
    echo "mkdocs build --strict failed: fix the links above (docs/, mkdocs.yml)" >&2
    return "$rc"
  fi
}

lane() {
  # One pytest lane. "No tests collected" (exit 5) is no failure: arguments may leave a lane nothing to run.
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" = 5 ] && rc=0
  return "$rc"
}

timed_lane() {
  # A lane that says when it ended (seconds since dev.sh started): where CI's minutes go.
  local rc=0
  lane "$@" || rc=$?
  echo "==> lane ended at ${SECONDS} s"
  return "$rc"
}

heavy_lanes() {
  # The heavy tests in two lanes at once, each one test at a time: the training runs with the Slurm tests
  # (one local cluster a session: its tests stay in one lane), and the rest (the page's and the after-training
  # tests, with their session-wide trained runs). One lane alone left a core idle much of the time (measured
  # with /usr/bin/time: 93% CPU of 200% for the first-load browser test, 155% for training runs), and took
  # 41 of CI's 45 minutes. Each line of output names its lane.
  # A run file goes to the page lane to even the two out: a clean-clone CI on 2026-12-05 with four lent took
  # 37:11 in the runs lane and 39:58 in the page lane; test_notify.py and test_dataset_mix.py (about 1:30) went back,
  # and test_smoke_load_path.py (about 1:50) when GGUF export and Evaluate's benchmarks added about 4 minutes there.
  local lent=(tests/runs/test_resume_shape.py)
  local own=(tests/slurm tests/panel/test_browser_slurm_ssh.py) ignore=() rc=0 runs page path
  for path in tests/runs/test_*.py; do
    [[ " ${lent[*]} " == *" $path "* ]] || own+=("$path")
  done
  for path in "${own[@]}"; do ignore+=("--ignore=$path"); done
  timed_lane -p no:cacheprovider "$@" "${own[@]}" 2>&1 | sed -u 's/^/[runs] /' &
  runs=$!
  timed_lane -p no:cacheprovider "$@" "${ignore[@]}" 2>&1 | sed -u 's/^/[page] /' &
  page=$!
  wait "$runs" || rc=$?
  wait "$page" || rc=$?
  return "$rc"
}

case "${1:-}" in
  demo)
    shift
    setup_venv
    exec .venv/bin/tunedeck ui --preset demo "$@"
    ;;
  test)
    shift
    # Debian's packages and npm's (the network and dpkg) install while pip fills .venv: apart, the two took
    # their sum; each writes its own log, printed whole only if it fails.
    system_log=$(mktemp)
    # SkyPilot gets a venv of its own (.venv/sky: it pins older click and uvicorn), for the tests that read
    # sky.yaml with its loader (tests/sky/sky_env.py; about 40 s).
    (setup_chromium && setup_axe && setup_slurm && setup_go && "$PYTHON" tests/sky/sky_env.py >/dev/null) >"$system_log" 2>&1 &
    system=$!
    setup_venv
    if ! wait "$system"; then cat "$system_log" >&2; echo "dev.sh: installing the system's test tools failed (above)" >&2; exit 1; fi
    cat "$system_log"
    rm -f "$system_log"
    echo "==> installed in ${SECONDS} s"
    # Beside the lint and the first lane, which need neither: DeepSpeed's CPU ops, then GGUF export's compiled
    # llama.cpp (only the heavy lanes use them).
    ops_log=$(mktemp)
    (
      build_deepspeed_ops || echo "==> DeepSpeed's CPU ops failed to build (above): the runs that need them build them"
      SECONDS=0
      install_export && echo "==> llama.cpp for GGUF export installed in ${SECONDS} s"
    ) >"$ops_log" 2>&1 &
    building=$!
    # The lint (mostly one core, waiting on the type checker) runs beside the first lane; its output comes after.
    lint_log=$(mktemp)
    lint >"$lint_log" 2>&1 &
    linting=$!
    # The single-process tests on two workers at once (pytest-xdist: 110 s instead of 230 s on the 2-core
    # CI machine), then the multi-process runs, the browser and the slow tests in two lanes of their own
    # (heavy_lanes; one lane when arguments choose the tests). CI (CI=true, 2 cores, 45 minutes) leaves out
    # the two tests that run bench/ scripts at a tiny size (about 2 minutes); `bash dev.sh test` anywhere
    # else runs them too. CI lists its 40 slowest tests of each lane to show where its time goes.
    heavy="integration or browser or slow" not_bench="" durations=()
    if [ "${CI:-}" = true ]; then not_bench=" and not bench" durations=(--durations=40); fi
    rc=0
    lane -n 2 -m "not ($heavy)$not_bench" "$@" || rc=$?
    lint_rc=0
    wait "$linting" || lint_rc=$?
    cat "$lint_log"
    rm -f "$lint_log"
    if [ "$lint_rc" != 0 ]; then echo "dev.sh: the lint failed (above)" >&2; exit "$lint_rc"; fi
    echo "==> lint and the single-process tests done at ${SECONDS} s"
    if ! wait "$building"; then
      cat "$ops_log" >&2
      echo "dev.sh: installing llama.cpp for GGUF export failed (above)" >&2
      exit 1
    fi
    grep "^==>" "$ops_log" || true
    rm -f "$ops_log"
    echo "==> DeepSpeed's CPU ops and llama.cpp built at ${SECONDS} s"
    if [ $# = 0 ]; then
      heavy_lanes -m "($heavy)$not_bench" "${durations[@]}" || rc=$?
    else
      lane -m "($heavy)$not_bench" "${durations[@]}" "$@" || rc=$?
    fi
    echo "==> all tests done at ${SECONDS} s"
    exit "$rc"
    ;;
  test-fast)
    shift
    setup_venv
    lint
    # The hostile property test tries 120 generated jobs in the full suite, 25 here.
    export TUNEDECK_HOSTILE_EXAMPLES=${TUNEDECK_HOSTILE_EXAMPLES:-25}
    exec .venv/bin/python -m pytest -n 2 -m "not integration and not browser and not slow" "$@"
    ;;
  lint)
    setup_venv
    lint
    ;;
  *)
    echo "usage: bash dev.sh demo | bash dev.sh test [pytest args] | bash dev.sh test-fast [pytest args] | bash dev.sh lint" >&2
    exit 2
    ;;
esac
