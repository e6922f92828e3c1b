"""The recipe as a bundle carries it: a few-line train_sft.py, and the package backend/recipe/ beside it as
tunedeck_recipe/, so that `bash launch.sh`, `sbatch slurm.sbatch` and `accelerate launch train_sft.py` run from the
bundle alone, without tunedeck installed. The package's modules import each other relatively, so it runs under
this name as it does inside tunedeck.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipe"
# The recipe's folder in a bundle: a name no other installed package has (a bare `recipe` could be anyone's).
RECIPE_PACKAGE = "tunedeck_recipe"
# The bundle's entry script: what launch.sh and slurm.sbatch start, and what `accelerate launch` is given.
ENTRY_SCRIPT = f'''#!/usr/bin/env python
"""Trains this bundle's job with the recipe in {RECIPE_PACKAGE}/ beside this file (its train_sft.py says what a run
does and writes in its run folder). launch.sh and slurm.sbatch start it so:

    accelerate launch --config_file accelerate_config.yaml train_sft.py \\
        --job job.yaml --training-args training_args.yaml [--run-dir DIR]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the recipe beside this file, wherever it is started from

from {RECIPE_PACKAGE}.train_sft import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
'''


@lru_cache(maxsize=1)
def recipe_files() -> dict[str, str]:
    """{bundle path: text} of every module of the recipe package, under RECIPE_PACKAGE/, read once: the panel
    renders a bundle on every change. Empty when the package is not there (a stripped install)."""
    try:
        return {
            f"{RECIPE_PACKAGE}/{path.name}": path.read_text(encoding="utf-8")
            for path in sorted(RECIPE_DIR.glob("*.py"))
        }
    except OSError:
        return {}
