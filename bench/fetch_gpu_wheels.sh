#!/usr/bin/env bash
# Wheels the GPU check needs that the lent GPU machine (Python 3.12, x86-64, torch for CUDA 13) lacks or has
# too old (transformers < 5.23); about 28 MB, under the 64 MiB that may travel with the working tree.
# DeepSpeed publishes no wheel: it is built here (pure Python; its ops compile on first use there).
# bitsandbytes keeps its CUDA 13 and CPU libraries alone (bench/slim_wheel.py): all of them are 129 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl \
  trl==1.16.0 datasets==5.2.0 bitsandbytes==0.50.2 pydantic==2.14.4 pydantic_core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 dill==0.4.1 multiprocess==0.70.19 \
  transformers==5.24.0 peft==0.21.2 hjson==3.1.0
python3 bench/slim_wheel.py .whl/bitsandbytes-0.50.2-*.whl 'libbitsandbytes_(cuda1[12]|rocm|xpu)'
if ! compgen -G ".whl/deepspeed-*.whl" >/dev/null; then
  DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
fi
du -sh .whl
