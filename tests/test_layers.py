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
backend/recipe/ ships in every bundle (tunedeck_recipe/ beside train_sft.py), so its modules import only each
other, relatively; backend/runs/supervisor.py runs as a bare script, so it imports nothing of tunedeck.

Imports are read with ast, function-local ones included: the code imports heavy or optional
parts inside functions, and those are dependencies all the same. A string that is exactly a
module's name (importlib.import_module, a command registry) counts as an import too.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
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
STANDALONE = {"tunedeck.backend.runs.supervisor", "tunedeck.backend.runs.slurm_jobs"}
RECIPE = "tunedeck.backend.recipe"  # ships in every bundle: its modules import only each other


# Issue 10: a reader takes a module in at one sitting. The exception cannot be split: the supervisor runs as a
# script with nothing but psutil; its docstring says so at its top.
MAX_LINES = 400
LONG_ON_PURPOSE = {
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
            if module.startswith(RECIPE + ".") and not target.startswith(RECIPE + "."):
                problems.append(
                    f"{where} (the recipe runs in bundles without tunedeck: it imports only its own modules)"
                )
                continue
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


# Circles engineers are opening now; nothing may be added here (evaluation's was opened by backend/after/scoring.py).
ALLOWED_CIRCLES: list[set[str]] = []


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


def formatted(root: Path = REPO) -> dict[str, str]:
    """Path -> text of every module as `ruff format` writes it with the project's settings: one ruff call
    over a copy of the tree (the checkout itself is left as it is)."""
    files = {file.relative_to(root).as_posix(): file for file in package_files(root)}
    with tempfile.TemporaryDirectory() as tmp:
        for path, file in files.items():
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, Path(tmp) / path)
        config = ["--config", str(REPO / "pyproject.toml")]
        done = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--no-cache", "--quiet", *config, tmp],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"ruff format could not format the package:\n{done.stderr}"
        return {path: (Path(tmp) / path).read_text(encoding="utf-8") for path in files}


def too_long(root: Path = REPO) -> list[str]:
    """Each module over MAX_LINES lines as `ruff format` writes it, as 'path: N lines', except those long on
    purpose. Measured formatted, so that a line packed past the formatter (and kept by `# fmt: skip`) still
    counts as the lines it is."""
    found = []
    for path, text in sorted(formatted(root).items()):
        lines = len(text.splitlines())
        if lines > MAX_LINES and path not in LONG_ON_PURPOSE:
            found.append(
                f"{path}: {lines} lines as `ruff format` writes it "
                f"(at most {MAX_LINES}: split it into modules with one job each)"
            )
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
    (tmp_path / "backend" / "runs").mkdir(parents=True)
    (tmp_path / "backend" / "runs" / "supervisor.py").write_text("x = 1\n" * 2000)
    assert too_long(tmp_path) == [
        "app/big.py: 401 lines as `ruff format` writes it (at most 400: split it into modules with one job each)"
    ]


def test_a_module_is_measured_as_ruff_formats_it(tmp_path):
    """41 lines, each a call the formatter writes on 10 lines: 410 lines."""
    (tmp_path / "app").mkdir()
    call = "show(" + ", ".join(f"argument_number_{i}=value_{i}" for i in range(8)) + ")"
    (tmp_path / "app" / "packed.py").write_text(f"{call}\n" * 41)
    assert too_long(tmp_path) == [
        "app/packed.py: 410 lines as `ruff format` writes it (at most 400: split it into modules with one job each)"
    ]


def marked_statement(tree: ast.Module, line: int) -> ast.stmt | None:
    """The statement a trailing `# fmt: skip` on this line keeps as written: the innermost one ending there."""
    ending = [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.end_lineno == line]
    return max(ending, key=lambda node: node.lineno, default=None)


def is_table_part(node: ast.expr) -> bool:
    """A table's cell or row: a literal, a named constant, a display of parts, or a row built from parts
    (`Strategy("zero3", ...)`): data laid out by hand, no computation."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, ast.BinOp):  # rows shared between tables, joined: REWARDS + WINS
        return isinstance(node.op, ast.Add) and is_table_part(node.left) and is_table_part(node.right)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(is_table_part(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and is_table_part(key) for key in node.keys) and all(map(is_table_part, node.values))
    if isinstance(node, ast.Call):
        rows = [*node.args, *(keyword.value for keyword in node.keywords)]
        return isinstance(node.func, (ast.Name, ast.Attribute)) and all(map(is_table_part, rows))
    return False


def is_literal_table(node: ast.stmt | None) -> bool:
    """An assignment (`X = ...` or `X: T = ...`) of a tuple, list, dict or set display of literals, named constants
    and rows built from them (a dataclass per row), or a comprehension that only keys such a display's rows
    (`{row.name: row for row in (Row(...), ...)}`)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    value = node.value
    if isinstance(value, (ast.DictComp, ast.ListComp, ast.SetComp)):
        simple = (ast.Name, ast.Attribute)
        elts = [value.key, value.value] if isinstance(value, ast.DictComp) else [value.elt]
        loops = value.generators
        return (
            len(loops) == 1
            and not loops[0].ifs
            and all(isinstance(elt, simple) for elt in elts)
            and isinstance(loops[0].iter, (ast.Tuple, ast.List))
            and is_table_part(loops[0].iter)
        )
    return isinstance(value, (ast.Tuple, ast.List, ast.Dict, ast.Set)) and is_table_part(value)


def skips_off_tables(root: Path = REPO) -> list[str]:
    """Each `# fmt: skip` on anything but a literal table, as 'path:line (what it marks)'."""
    found = []
    for file in sorted(package_files(root)):
        path = file.relative_to(root).as_posix()
        source = file.read_text(encoding="utf-8")
        tree = ast.parse(source)
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and re.search(r"\bfmt:\s*skip\b", token.string):
                line = token.start[0]
                node = marked_statement(tree, line)
                if not is_literal_table(node):
                    what = f"ast.{type(node).__name__}" if node else "a line where no statement ends"
                    found.append(f"{path}:{line} (`# fmt: skip` on {what}, not a literal table)")
    return found


def test_fmt_skip_only_keeps_literal_tables():
    """`# fmt: skip` keeps a table's rows aligned; on code it packs lines past the formatter and the 400-line
    rule. It may mark only an assignment of a table: literals, named constants and rows built from them."""
    problems = skips_off_tables()
    assert problems == [], (
        "`# fmt: skip` may mark only an assignment of a table (literals, named constants, rows built from them) "
        "(remove the marker and let ruff format the code):\n" + "\n".join(problems)
    )


def test_a_skip_off_a_table_is_named(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "view.py").write_text(
        "TABLE = (\n    ('a', 1),  ('bb', 22),\n)  # fmt: skip\n"
        "SIZES: dict = {'a': [1, -2.5, None]}  # fmt: skip\n"
        "ROWS = {r.name: r for r in (Row('a', 1),  Row('bb', -2))}  # fmt: skip\n"
        "CALLS = (make(a * 2),)  # fmt: skip\n"
        "show(1,  2)  # fmt: skip\n"
        "def f(a,  b):  # fmt: skip\n"
        "    return [a,  b]  # fmt: skip\n"
    )
    assert skips_off_tables(tmp_path) == [
        "app/view.py:6 (`# fmt: skip` on ast.Assign, not a literal table)",
        "app/view.py:7 (`# fmt: skip` on ast.Expr, not a literal table)",
        "app/view.py:8 (`# fmt: skip` on a line where no statement ends, not a literal table)",
        "app/view.py:9 (`# fmt: skip` on ast.Return, not a literal table)",
    ]


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
            "tunedeck.backend.recipe.train_sft",
            "def f():\n    import tunedeck.backend.spec\n",
            "tunedeck.backend.recipe.train_sft:{n} imports tunedeck.backend.spec "
            "(the recipe runs in bundles without tunedeck: it imports only its own modules)",
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


# Issue 33: the panel and the CLI use a backend package through its face, the names its __init__ lists in __all__
# (`from tunedeck.backend.spec import JobSpec`), never through its modules: a package can then move code between its
# modules without touching either front end. backend/ itself holds packages, and a few modules at most.
FRONT_ENDS = ("tunedeck.app", "tunedeck.backend.cli")
FACE = re.compile(r"tunedeck\.backend\.\w+")
MAX_LOOSE_BACKEND_MODULES = 8


def face_names(source: str) -> set[str]:
    """The names a package's __init__ lists in `__all__`, as written."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "__all__" for target in node.targets):
            return {element.value for element in node.value.elts if isinstance(element, ast.Constant)}
    return set()


def source_path(module: str, known: set[str]) -> str:
    parts = module.split(".")[1:]
    return "/".join(parts) + ("/__init__.py" if any(name.startswith(module + ".") for name in known) else ".py")


def face_violations(sources: dict[str, str]) -> list[str]:
    """Each import in app/ and backend/cli/ (function-local ones and module names in strings included) that reaches
    past a backend package's face, as 'path:line what (the face to use)'."""
    known = set(sources)
    problems = []
    for module, source in sorted(sources.items()):
        if not any(module == end or module.startswith(end + ".") for end in FRONT_ENDS):
            continue
        own = FACE.match(module).group() if module.startswith("tunedeck.backend.") else None
        path = source_path(module, known)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                reached = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                if FACE.fullmatch(base) and base != own and base in known:
                    names = face_names(sources[base])
                    for alias in node.names:
                        if f"{base}.{alias.name}" in known:
                            reached = [f"{base}.{alias.name}"]
                        elif alias.name not in names:
                            problems.append(
                                f"{path}:{node.lineno} imports {alias.name} from {base}, whose face does not name it "
                                f"(add it to __all__ in {source_path(base, known)})"
                            )
                            continue
                        else:
                            continue
                        problems += _past_face(path, node.lineno, reached, own, known)
                    continue
                reached = [base]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                reached = [node.value]
            else:
                continue
            problems += _past_face(path, node.lineno, reached, own, known)
    return sorted(problems, key=lambda problem: (problem.split(":")[0], int(problem.split(":")[1].split()[0])))


def _past_face(path: str, line: int, modules: list[str], own: str | None, known: set[str]) -> list[str]:
    found = []
    for target in modules:
        face = FACE.match(target)
        if face and target != face.group() and face.group() != own and face.group() in known:
            found.append(
                f"{path}:{line} imports {target} (the panel and the CLI import package faces only: "
                f"from {face.group()} import ...)"
            )
    return found


def test_the_front_ends_import_package_faces_only():
    sources = package_sources()
    assert {"tunedeck.app.page", "tunedeck.backend.cli", "tunedeck.backend.spec"} <= set(sources)
    assert face_violations(sources) == []


def test_an_import_past_a_face_is_named(tmp_path):
    files = {
        "backend/spec/__init__.py": 'from tunedeck.backend.spec.fields import FORM_FIELDS\n\n__all__ = ["FORM_FIELDS"]\n',
        "backend/spec/fields.py": "FORM_FIELDS = []\nJOB = 1\n",
        "backend/runs/__init__.py": "__all__ = []\n",
        "backend/runs/manager.py": "class RunManager: ...\n",
        "backend/cli/__init__.py": "from tunedeck.backend.cli import runs\nfrom tunedeck.backend.spec import FORM_FIELDS\n",
        "backend/cli/runs.py": "from ..spec.fields import FORM_FIELDS\nCOMMANDS = ['tunedeck.backend.cli.runs']\n",
        "app/page.py": (
            "import importlib\n"
            "from tunedeck.backend.spec import FORM_FIELDS\n"
            "from tunedeck.backend.spec.fields import JOB\n"
            "def f():\n"
            "    from tunedeck.backend.runs.manager import RunManager\n"
            "    return importlib.import_module('tunedeck.backend.runs.manager')\n"
            "from tunedeck.backend.runs import manager\n"
            "from tunedeck.backend.spec import JOB\n"
            "import tunedeck.backend.spec.fields\n"
        ),
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    face = "(the panel and the CLI import package faces only: from tunedeck.backend.{} import ...)"
    assert face_violations(package_sources(tmp_path)) == [
        f"app/page.py:3 imports tunedeck.backend.spec.fields {face.format('spec')}",
        f"app/page.py:5 imports tunedeck.backend.runs.manager {face.format('runs')}",
        f"app/page.py:6 imports tunedeck.backend.runs.manager {face.format('runs')}",
        f"app/page.py:7 imports tunedeck.backend.runs.manager {face.format('runs')}",
        "app/page.py:8 imports JOB from tunedeck.backend.spec, whose face does not name it "
        "(add it to __all__ in backend/spec/__init__.py)",
        f"app/page.py:9 imports tunedeck.backend.spec.fields {face.format('spec')}",
        f"backend/cli/runs.py:1 imports tunedeck.backend.spec.fields {face.format('spec')}",
    ]


def loose_backend_modules(root: Path = REPO) -> list[str]:
    """A problem if backend/ holds more than MAX_LOOSE_BACKEND_MODULES modules directly, outside its packages."""
    loose = sorted(file.name for file in (root / "backend").glob("*.py"))
    if len(loose) <= MAX_LOOSE_BACKEND_MODULES:
        return []
    return [
        f"backend/ holds {len(loose)} modules directly ({', '.join(loose)}; at most {MAX_LOOSE_BACKEND_MODULES}): "
        "move each into the package of its role and place new packages in LAYERS"
    ]


def test_backend_holds_packages_and_few_modules():
    assert loose_backend_modules() == []


def test_too_many_loose_backend_modules_are_named(tmp_path):
    (tmp_path / "backend" / "spec").mkdir(parents=True)
    (tmp_path / "backend" / "spec" / "fields.py").write_text("")
    for name in ["__init__", *(f"m{i}" for i in range(MAX_LOOSE_BACKEND_MODULES - 1))]:
        (tmp_path / "backend" / f"{name}.py").write_text("")
    assert loose_backend_modules(tmp_path) == []
    (tmp_path / "backend" / "extra.py").write_text("")
    assert loose_backend_modules(tmp_path) == [
        "backend/ holds 9 modules directly (__init__.py, extra.py, m0.py, m1.py, m2.py, m3.py, m4.py, m5.py, m6.py; "
        "at most 8): move each into the package of its role and place new packages in LAYERS"
    ]


def test_rendering_reads_the_recipe_once():
    """The panel renders the bundle on every change: the generators read no file per call (the recipe's
    modules once each)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tunedeck.backend.render import render_bundle\n"
        "from tunedeck.backend.spec import resolve_spec\n"
        "spec = resolve_spec('7b-lora-ddp')\n"
        "opened = []\n"
        "recipe = str(Path(sys.modules['tunedeck.backend.recipe'].__file__).parent)\n"
        "sys.addaudithook(lambda event, args: event == 'open' and str(args[0]).startswith(recipe) and opened.append(args[0]))\n"
        "for _ in range(3):\n"
        "    assert 'train_sft.py' in render_bundle(spec)\n"
        "print(max(map(opened.count, opened), default=0))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) <= 1


# What a recipe module may import where: it runs in bundles without tunedeck, and tunedeck's panel reads its tables
# without the training stack (tests/panel/test_imports.py).
# psutil comes with accelerate; pynvml (nvidia-ml-py) is in every bundle's requirements.txt for the telemetry
TRAINING_STACK = {"yaml", "torch", "transformers", "trl", "peft", "datasets", "accelerate", "deepspeed", "bitsandbytes"}
TRAINING_STACK |= {"psutil", "pynvml"}


def recipe_import_problems(name: str, source: str, siblings: set[str]) -> list[str]:
    """Each import of a recipe module that is not the standard library, a sibling imported relatively, or (inside
    a function) the training stack, as 'name:line what (why)'."""
    tree = ast.parse(source)
    at_import = {id(node) for node in tree.body}  # module level: run as the module is imported
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 1 or (node.module or "").split(".")[0] not in siblings:
                problems.append(f"{name}:{node.lineno} from {'.' * node.level}{node.module or ''} (not a sibling)")
            continue
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            tops = [(node.module or "").split(".")[0]]
        else:
            continue
        for top in tops:
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in TRAINING_STACK and id(node) not in at_import:
                continue
            why = "at import: import it inside the function that needs it" if top in TRAINING_STACK else "not allowed"
            problems.append(f"{name}:{node.lineno} {top} ({why})")
    return problems


def test_the_recipe_imports_the_standard_library_its_siblings_relatively_and_the_training_stack_lazily():
    folder = REPO / "backend" / "recipe"
    siblings = {path.stem for path in folder.glob("*.py")}
    problems = [
        p for path in sorted(folder.glob("*.py")) for p in recipe_import_problems(path.name, path.read_text(), siblings)
    ]
    assert problems == []


def test_a_recipe_import_that_would_break_a_bundle_is_named():
    source = (
        "import os\nimport torch\nfrom tunedeck.backend.spec import JobSpec\nfrom .records import X\n"
        "from ..spec import Y\nfrom .nowhere import Z\n\n\ndef f():\n    import trl\n    import pandas\n"
    )
    assert recipe_import_problems("m.py", source, {"records"}) == [
        "m.py:2 torch (at import: import it inside the function that needs it)",
        "m.py:3 tunedeck (not allowed)",
        "m.py:5 from ..spec (not a sibling)",
        "m.py:6 from .nowhere (not a sibling)",
        "m.py:11 pandas (not allowed)",
    ]
