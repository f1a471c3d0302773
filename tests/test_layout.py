"""The layout reads as the data path, and stays that way.

Stages import only the stages before them: the source rows, the pure mapping,
the OTLP export, the pipeline that drives them, the bridge's own telemetry,
the factory, then operations and the command line on top. A module that
imports a later stage, an import cycle, a module past 350 lines or a crowded
top level fails here, with the offending names.

The wiring has rules of its own: below the factory no module imports the whole
Config (each part takes its own section), above it no module builds a part
itself (it asks the factory), and no constructor takes more than 8 parameters.

CONTRIBUTING.md lists every module, gives every test file a stage and names the
tests of every module; a module or a test file added, renamed or removed
without a line there fails here too.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import run_otel

PACKAGE = Path(run_otel.__file__).parent

# Earlier entries are lower: each may import only itself and what comes before it.
LAYERS = [
    ["__init__", "otel_env", "config", "sharding", "backoff"],
    ["source"],
    ["mapping"],
    ["export"],
    ["pipeline"],
    ["telemetry"],
    ["factory"],
    ["ops", "generate"],
    ["cli", "__main__"],
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
MAX_LINES = 350
MAX_TOP_LEVEL = 12
MAX_PARAMETERS = 8
# The parts the factory builds: above it, ops/ and cli/ ask the factory for them.
PARTS = {
    "Source",
    "StateStore",
    "GrpcSink",
    "HttpSink",
    "JsonFileSink",
    "GrpcLogSink",
    "HttpLogSink",
    "build_log_sink",
    "StoreLock",
    "FileLock",
    "MySqlStoreLock",
    "store_lock",
    "NamedLock",
    "MySqlLease",
}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the run_otel modules it imports, lazily imported ones included."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{alias.name}" for alias in node.names]
                targets = [name for name in names if _is_module(name)] or [target]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[module] |= {t for t in targets if t.split(".")[0] == "run_otel" and t != module}
    return graph


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_graph_is_read_from_the_source():
    graph = _imports()
    # Precondition: the walk finds the package and the edges a reader would name.
    assert "run_otel.pipeline.poller" in graph and "run_otel.source.reader" in graph["run_otel.pipeline.poller"]
    assert "run_otel.factory" in graph["run_otel.ops.daemon"]
    stages = {_stage(m) for m in graph} | {_stage(t) for targets in graph.values() for t in targets}
    assert stages <= RANK.keys(), f"a stage with no place in LAYERS: {sorted(stages - RANK.keys())}"


def test_no_stage_imports_a_later_one():
    upward = [
        f"{module} -> {target}"
        for module, targets in _imports().items()
        for target in targets
        if RANK[_stage(target)] > RANK[_stage(module)]
    ]
    assert not upward, "imports of a later stage:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    graph = _imports()
    done: set[str] = set()
    cycles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_modules_stay_small_and_the_top_level_uncrowded():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules at the top of the package: {top}"


def _trees() -> dict[str, ast.Module]:
    return {_module(path): ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}


def test_below_the_factory_no_module_imports_the_whole_config():
    """Each part takes its own section: a module below the factory that imports Config could read any of them."""
    importers = {
        module
        for module, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and any(alias.name == "Config" for alias in node.names)
    }
    assert {"run_otel.factory", "run_otel.ops.daemon"} <= importers  # precondition: the walk sees the imports
    below = sorted(m for m in importers if RANK[_stage(m)] < RANK["factory"] and _stage(m) != "config")
    assert not below, f"modules below the factory importing Config (take the section instead): {below}"


def test_above_the_factory_every_part_comes_from_it():
    """ops/ and cli/ get each Source, state store, sink and lock from a factory function, so each is built one way."""
    calls = defaultdict(list)
    for module, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in PARTS:
                    calls[module].append(f"{name} (line {node.lineno})")
    assert calls["run_otel.factory"]  # precondition: the walk finds the factory's own calls
    above = {m: c for m, c in calls.items() if RANK[_stage(m)] > RANK["factory"]}
    assert not above, f"parts built above the factory (ask the factory): {above}"


def test_no_constructor_takes_more_than_eight_parameters():
    """A written-out __init__ with more than 8 parameters wants what travels together grouped."""
    counts = {
        f"{module}.{node.name}": len(init.args.posonlyargs) + len(init.args.args) - 1 + len(init.args.kwonlyargs)
        for module, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for init in node.body
        if isinstance(init, ast.FunctionDef) and init.name == "__init__"
    }
    assert counts["run_otel.pipeline.poller.Poller"] >= 5  # precondition: the count sees the constructors
    wide = {name: n for name, n in counts.items() if n > MAX_PARAMETERS}
    assert not wide, f"constructors over {MAX_PARAMETERS} parameters: {wide}"


CONTRIBUTING = PACKAGE.parent.parent / "CONTRIBUTING.md"


def _section(title: str) -> str:
    text = CONTRIBUTING.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _package_modules() -> set[str]:
    """Each module as CONTRIBUTING.md names it: its path under the package, a subpackage's as its folder."""
    return {
        p.relative_to(PACKAGE).as_posix() if p.name != "__init__.py" else p.parent.relative_to(PACKAGE).as_posix() + "/"
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or len(p.relative_to(PACKAGE).parts) > 2  # a stage's __init__ is its docstring
    }


def test_contributing_lists_every_module_once_and_no_other():
    listed = {line.split()[0] for line in _section("The layout").split("```")[1].splitlines()[2:] if line.strip()}
    modules = _package_modules() - {"__main__.py"}
    assert len(modules) > 60  # precondition: the walk found the package
    assert listed == modules, f"missing: {sorted(modules - listed)}; gone: {sorted(listed - modules)}"


def test_contributing_maps_every_test_file_to_its_stage():
    mapped = set(re.findall(r"`(test_\w+\.py)`", _section("Where a module's tests are")))
    files = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    assert files and mapped == files, f"not mapped: {sorted(files - mapped)}; gone: {sorted(mapped - files)}"


def _tests_by_module() -> tuple[dict[str, list[str]], list[str]]:
    """The map's lines as module -> test files, and the modules given a second line.

    An indented line belongs to the folder named above it; a line at the margin is a top-level module.
    """
    mapped: dict[str, list[str]] = {}
    repeated: list[str] = []
    folder = ""
    for line in _section("Which tests cover a module").split("```")[1].splitlines()[1:]:
        if not line.strip():
            continue
        if "—" not in line and not line.startswith(" ") and line.endswith("/"):
            folder = line
            continue
        name, _, files = line.partition("—")
        module = (folder if line.startswith(" ") else "") + name.strip()
        if module in mapped:
            repeated.append(module)
        mapped[module] = [f.strip() for f in files.split(",") if f.strip()]
    return mapped, repeated


def test_contributing_names_the_tests_of_every_module():
    mapped, repeated = _tests_by_module()
    modules = _package_modules()
    assert len(mapped) > 60  # precondition: the section was found and its lines read
    assert mapped.keys() == modules, (
        f"modules with no line: {sorted(modules - mapped.keys())}; lines for no module: {sorted(mapped.keys() - modules)}"
    )
    assert not repeated, f"modules with two lines: {repeated}"
    files = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    unknown = {module: sorted(set(named) - files) for module, named in mapped.items() if set(named) - files}
    assert not unknown, f"test files that do not exist: {unknown}"
    # More than five stops saying which tests matter; a file named twice is a slip.
    uneven = sorted(module for module, named in mapped.items() if not 1 <= len(named) <= 5 or len(set(named)) < len(named))
    assert not uneven, f"lines with no test file, more than five, or one twice: {uneven}"
