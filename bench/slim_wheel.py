"""Rewrite a wheel without the files whose names match a pattern (and their RECORD lines).

bitsandbytes ships one library per CUDA version (about 130 MB unpacked); the lent GPU machine's torch is
built for CUDA 13, and the working tree that travels there has a 64 MiB limit, so fetch_gpu_wheels.sh keeps
the CUDA 13 and CPU libraries alone.
Usage: python3 bench/slim_wheel.py WHEEL REGEX
"""

import re
import sys
import zipfile
from pathlib import Path


def slim(wheel: Path, drop: re.Pattern) -> int:
    kept = wheel.with_suffix(".slim")
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(kept, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if drop.search(item.filename):
                dropped += 1
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not drop.search(line.split(",", 1)[0])).encode()
            dst.writestr(item, data)
    kept.replace(wheel)
    return dropped


if __name__ == "__main__":
    path, pattern = Path(sys.argv[1]), re.compile(sys.argv[2])
    print(f"{path.name}: {slim(path, pattern)} files left out")
