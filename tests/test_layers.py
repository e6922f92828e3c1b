"""The layers of the code, enforced as a folder map: no module imports one from a layer above it or beside it.

    0 recipe/   the training recipe (ships in every bundle)  | machine/  NVML and psutil readings
    1 spec/     the job spec, its fields, presets and implications (the vocabulary sits in recipe/)
    2 validate/ rules across fields   | estimate/ memory, speed, advisor   | data/ uploads, preview, demo
    3 render/   the bundle's files
    4 runs/     run folders, launching, following, Slurm, checkpoints
    5 after/    try, evaluate, merge, push
    6 cli/      the command line      | app/      the panel
    7 tunedeck/__main__.py: the console script, the one place that composes both front ends

Layers of the same rank are peers and do not import each other: the CLI and the panel are two
front ends over the same API, render and estimate two readings of the same spec.
backend/recipe/train.py ships alone in every bundle (train_sft.py) and backend/runs/supervisor.py runs as a
bare script, so they import nothing of tunedeck.

Imports are read with ast, function-local ones included: the code imports heavy or optional
parts inside functions, and those are dependencies all the same. A string that is exactly a
module's name (importlib.import_module, a command registry) counts as an import too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The folder map: (layer, rank, module-name pattern); the first match places a module, so a new module is placed
# by the folder it is in. A new folder must be placed here.
B = r"tunedeck\.backend"
LAYERS = [
    ("root", 0, r"tunedeck(\.backend)?"),
    ("recipe", 0, rf"{B}\.recipe(\..+)?"),  # ships in every bundle: imports nothing of tunedeck
    ("machine", 0, rf"{B}\.machine(\..+)?"),  # this machine's GPUs and memory (NVML, psutil)
    ("spec", 1, rf"{B}\.spec(\..+)?"),  # the job: its fields, vocabulary, presets and what a choice implies
    ("validate", 2, rf"{B}\.validate(\..+)?"),  # rules across fields -> problems
    ("estimate", 2, rf"{B}\.estimate(\..+)?"),  # memory, speed, the advisor
    ("data", 2, rf"{B}\.data(\..+)?"),  # uploads, what a file is, the preview, the demo
    ("render", 3, rf"{B}\.render(\..+)?"),  # the bundle's files
    ("runs", 4, rf"{B}\.runs(\..+)?"),  # run folders, launching, following, Slurm, checkpoints
    ("after", 5, rf"{B}\.after(\..+)?"),  # try, evaluate, merge, push: they read run folders
    ("cli", 6, rf"{B}\.cli(\..+)?"),  # the command line
    ("app", 6, r"tunedeck\.app(\..+)?"),  # the panel
    ("entry", 7, r"tunedeck\.__main__"),
]
STANDALONE = {"tunedeck.backend.recipe.train", "tunedeck.backend.runs.supervisor", "tunedeck.backend.runs.slurm_jobs"}


# Issue 10: a reader takes a module in at one sitting. The exceptions cannot be split: train.py ships
# alone in every bundle (train_sft.py), and the supervisor runs as a script with nothing but psutil;
# each docstring says so at its top.
MAX_LINES = 400
LONG_ON_PURPOSE = {
    "backend/recipe/train.py": "one long file on purpose",
    "backend/runs/supervisor.py": "One file on purpose",
}


def package_files(root: Path = REPO) -> list[Path]:
    """Every module the wheel installs (the root, app/, backend/)."""
    return [*root.glob("*.py"), *root.glob("app/**/*.py"), *root.glob("backend/**/*.py")]


def package_sources(root: Path = REPO) -> dict[str, str]:
    """Module name -> source of every module the wheel installs."""
    sources = {}
    for file in package_files(root):
        parts = file.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources[".".join(("tunedeck", *parts))] = file.read_text(encoding="utf-8")
    return sources


def layer_of(module: str) -> tuple[str, int] | None:
    for name, rank, pattern in LAYERS:
        if re.fullmatch(pattern, module):
            return name, rank
    return None


def imported_modules(module: str, source: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, tunedeck module) for every import in the source, wherever it sits."""
    is_package = any(name.startswith(module + ".") for name in known) or module == "tunedeck"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y, from .. import z
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # `from tunedeck.backend import catalog` imports a module
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            found.append((node.lineno, node.value))
    return sorted({(line, name) for line, name in found if name == "tunedeck" or name.startswith("tunedeck.")})


def layering_violations(sources: dict[str, str]) -> list[str]:
    """Every import that goes up or sideways, each as 'module:line imports target (why)'."""
    known = set(sources)
    problems = []
    for module, source in sorted(sources.items()):
        home = layer_of(module)
        if home is None:
            problems.append(f"{module} is in no layer: place it in LAYERS in tests/test_layers.py")
            continue
        for line, target in imported_modules(module, source, known):
            if target == module or module.startswith(target + "."):
                continue  # itself, or its own parent package (imported by Python anyway)
            where = f"{module}:{line} imports {target}"
            if module in STANDALONE:
                problems.append(f"{where} ({module} runs without tunedeck)")
                continue
            there = layer_of(target)
            if there is None:
                problems.append(f"{where} (no such module, or it is in no layer)")
            elif there[1] > home[1]:
                problems.append(f"{where} ({home[0]} must not import {there[0]}, a layer above it)")
            elif there[1] == home[1] and there[0] != home[0]:
                problems.append(f"{where} ({home[0]} and {there[0]} are peers: neither imports the other)")
    return problems


def test_the_package_keeps_its_layers():
    sources = package_sources()
    assert {"tunedeck.backend.spec", "tunedeck.app.page", "tunedeck.__main__"} <= set(sources)
    assert layering_violations(sources) == []


# Circles engineers are opening now (issue 33: evaluation's data and scoring helpers into one module);
# the lead removes this entry when they land. Nothing else may be added here.
ALLOWED_CIRCLES = [
    {
        "tunedeck.backend.after.evaluate",
        "tunedeck.backend.after.eval_answers",
        "tunedeck.backend.after.eval_results",
        "tunedeck.backend.after.examples",
    },
]


def import_circles(sources: dict[str, str]) -> list[list[str]]:
    """Every group of modules that import each other round a circle (module-level and function-local imports
    alike: a local import only hides a circle), each sorted; Tarjan's strongly connected components."""
    known = set(sources)
    edges = {
        module: sorted({t for _, t in imported_modules(module, source, known) if t in known and t != module})
        for module, source in sources.items()
    }
    # A module importing its own parent package is Python's doing, not a circle of ours.
    edges = {module: [t for t in targets if not module.startswith(t + ".")] for module, targets in edges.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in edges[module]:
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(edges):
        if module not in order:
            visit(module)
    return sorted(circles)


def test_no_import_circles():
    circles = [circle for circle in import_circles(package_sources()) if set(circle) not in ALLOWED_CIRCLES]
    assert circles == []


def test_a_circle_through_a_local_import_is_found():
    sources = package_sources()
    sources["tunedeck.backend.runs.status"] += "def f():\n    from tunedeck.backend.runs.manager import RunManager\n"
    circles = import_circles(sources)
    assert any({"tunedeck.backend.runs.manager", "tunedeck.backend.runs.status"} <= set(c) for c in circles), circles


def too_long(root: Path = REPO) -> list[str]:
    """Each module over MAX_LINES lines, as 'path: N lines', except those long on purpose."""
    found = []
    for file in sorted(package_files(root)):
        path = file.relative_to(root).as_posix()
        lines = len(file.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and path not in LONG_ON_PURPOSE:
            found.append(f"{path}: {lines} lines (at most {MAX_LINES}: split it into modules with one job each)")
    return found


def test_no_module_is_over_400_lines():
    assert too_long() == []
    for path, reason in LONG_ON_PURPOSE.items():
        top = (REPO / path).read_text(encoding="utf-8").splitlines()[:20]
        assert reason in " ".join(top), f"{path} is long on purpose: its first lines must say why ({reason!r})"


def test_a_long_module_is_named(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "page.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "app" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "recipe").mkdir(parents=True)
    (tmp_path / "backend" / "recipe" / "train.py").write_text("x = 1\n" * 2000)
    assert too_long(tmp_path) == ["app/big.py: 401 lines (at most 400: split it into modules with one job each)"]


@pytest.mark.parametrize(
    ("module", "added", "expected"),
    [
        (  # core reaching a generator, inside a function
            "tunedeck.backend.validate",
            "def f():\n    from tunedeck.backend.render.accelerate_yaml import render_accelerate_config\n",
            "tunedeck.backend.validate:{n} imports tunedeck.backend.render.accelerate_yaml "
            "(validate must not import render, a layer above it)",
        ),
        (  # the CLI registering the panel's command by name
            "tunedeck.backend.cli",
            'COMMANDS = ["tunedeck.app.cli_ui"]\n',
            "tunedeck.backend.cli:{n} imports tunedeck.app.cli_ui (cli and app are peers: neither imports the other)",
        ),
        (  # the panel reaching into the CLI, relatively
            "tunedeck.app.page",
            "from ..backend.cli import runs\n",
            "tunedeck.app.page:{n} imports tunedeck.backend.cli.runs (app and cli are peers: neither imports the other)",
        ),
        (  # a generator reaching a run folder
            "tunedeck.backend.render.launch",
            "from tunedeck.backend import runs\n",
            "tunedeck.backend.render.launch:{n} imports tunedeck.backend.runs (render must not import runs, a layer above it)",
        ),
        (  # the bundle's entrypoint needing tunedeck
            "tunedeck.backend.recipe.train",
            "def f():\n    import tunedeck.backend.spec\n",
            "tunedeck.backend.recipe.train:{n} imports tunedeck.backend.spec (tunedeck.backend.recipe.train runs without tunedeck)",
        ),
    ],
)
def test_a_forbidden_import_is_named(module, added, expected):
    sources = package_sources()
    line = sources[module].count("\n") + 1 + added.count("\n") - 1
    sources[module] += added
    assert layering_violations(sources) == [expected.format(n=line)]


def test_a_new_module_must_be_placed_in_a_layer():
    sources = {**package_sources(), "tunedeck.backend.newthing": "import os\n"}
    assert layering_violations(sources) == [
        "tunedeck.backend.newthing is in no layer: place it in LAYERS in tests/test_layers.py"
    ]


def test_rendering_reads_the_training_script_once():
    """The panel renders the bundle on every change: the generators read no file per call."""
    code = (
        "import sys\n"
        "from tunedeck.backend.render import render_bundle\n"
        "from tunedeck.backend.spec import resolve_spec\n"
        "spec = resolve_spec('7b-lora-ddp')\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: event == 'open' and str(args[0]).endswith('train.py') and opened.append(args[0]))\n"
        "for _ in range(3):\n"
        "    assert 'train_sft.py' in render_bundle(spec)\n"
        "print(len(opened))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) <= 1
