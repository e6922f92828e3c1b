#!/usr/bin/env bash
# Wheels the GPU check needs that the lent GPU machine (Python 3.12, x86-64) lacks; about 48 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl \
  trl==1.16.0 datasets==5.2.0 bitsandbytes==0.50.2 pydantic==2.14.4 pydantic_core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 dill==0.4.1 multiprocess==0.70.19
du -sh .whl
