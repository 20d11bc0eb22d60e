"""The house stays as built: imports only go down the layers and never in a circle.

Layers, lowest first: ``longctx.core`` (the ground floor), ``longctx.pipeline``, ``longctx.packer``,
``longctx.trainer``, and the roof (``longctx`` itself: the CLI, the root config, the jobs, the demo).
Each layer is one top-level folder of the checkout (``core/``, ``pipeline/``, ``packer/``,
``trainer/``, ``longctx/``). A module may import its own layer and the layers below it, never a
higher one; nothing imports the roof; no module imports another in a circle; and nothing imports the
bare folder names ``core``, ``pipeline``, ``packer`` or ``trainer``. Every import counts: module
level, inside functions, under ``TYPE_CHECKING``, relative ones resolved.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# installed package -> folder of the checkout (pyproject.toml's package-dir)
PACKAGE_DIRS = {
    "longctx": REPO / "longctx",
    "longctx.core": REPO / "core",
    "longctx.pipeline": REPO / "pipeline",
    "longctx.packer": REPO / "packer",
    "longctx.trainer": REPO / "trainer",
}
LAYERS = {"longctx.core": 0, "longctx.pipeline": 1, "longctx.packer": 2, "longctx.trainer": 3}
ROOF = 4
OLD_NAMES = ("core", "pipeline", "packer", "trainer")


def discover_modules() -> dict[str, Path]:
    """Every module of the installed ``longctx`` package, by dotted name."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def layer_of(module: str) -> int:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return ROOF


def imported_names(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import in the file, relative ones resolved. ``from X
    import Y`` names the module ``X.Y`` when that is a module, else ``X``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def import_graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    """Modules and, for each, the longctx modules it imports (with the line of the import)."""
    modules = discover_modules()
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for name, line in imported_names(module, path, known):
            if name in known and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return modules, graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """One cycle through a strongly connected component, for the error message."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = min(n for n in graph[path[-1]] if n in component)
        if nxt in seen:
            return path[path.index(nxt) :] + [nxt]
        path.append(nxt)
        seen.add(nxt)


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"


def layer_violations(modules: dict[str, Path], graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for module, edges in graph.items():
        for target, line in edges.items():
            here, there = layer_of(module), layer_of(target)
            where = _where(modules[module], line)
            if there == ROOF and here != ROOF:
                problems.append(f"{where}: {module} imports the roof ({target})")
            elif there > here:
                problems.append(
                    f"{where}: {module} (layer {here}) imports {target} (layer {there}), a higher layer"
                )
    return problems


def old_name_imports(modules: dict[str, Path]) -> list[str]:
    problems = []
    known = set(modules)
    for module, path in modules.items():
        for name, line in imported_names(module, path, known):
            if name.split(".")[0] in OLD_NAMES:
                problems.append(f"{_where(path, line)}: imports {name} (use longctx.{name})")
    return problems


def test_every_part_folder_is_mapped() -> None:
    modules = discover_modules()
    assert {
        "longctx.core.errors",
        "longctx.pipeline.curate",
        "longctx.packer.run",
        "longctx.trainer.train",
    } <= set(modules)
    assert "longctx.cli" in modules


def test_each_top_level_folder_is_one_layer() -> None:
    """The roof's folder holds no lower layer, and every layer's folder sits at the top, in the
    layer order a reader meets them."""
    roof_packages = {p.parent.name for p in (REPO / "longctx").rglob("__init__.py")}
    assert roof_packages <= {"longctx", "commands"}, roof_packages
    for package, folder in PACKAGE_DIRS.items():
        assert folder.parent == REPO and (folder / "__init__.py").is_file(), package
    for module in discover_modules():
        folder = module.split(".")[1] if module.count(".") else ""
        expected = layer_of(module)
        assert (folder in {"core", "pipeline", "packer", "trainer"}) == (expected != ROOF), module


def test_no_import_goes_up_a_layer_or_into_the_roof() -> None:
    modules, graph = import_graph()
    assert layer_violations(modules, graph) == []


def test_no_import_cycle() -> None:
    _, graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_the_old_top_level_names() -> None:
    assert old_name_imports(discover_modules()) == []


def test_importing_longctx_imports_no_part() -> None:
    """``longctx/__init__.py`` imports nothing but the standard library's ``pkgutil`` (to find the
    parts when a checkout's roof folder is on the path first)."""
    tree = ast.parse((REPO / "longctx" / "__init__.py").read_text())
    imported = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"pkgutil"}


# --- the checks themselves must fail on a violation -----------------------------------------------


def test_checks_catch_back_edges_cycles_and_old_names(tmp_path: Path) -> None:
    files = {
        "longctx.packer.run": "def f():\n    from longctx.trainer import train\n",  # a lazy back edge
        "longctx.trainer.train": "from ..packer import run\n",  # relative and down, but closes a cycle
        "longctx.trainer.config": "import longctx.cli\n",  # into the roof
        "longctx.cli": "",
        "longctx.core.atomic": "from packer import run\n",  # an old name
    }
    modules = {}
    for name, source in files.items():
        modules[name] = tmp_path / f"{name}.py"
        modules[name].write_text(source)
    known = set(modules)
    graph = {
        m: {n: line for n, line in imported_names(m, p, known) if n in known and n != m}
        for m, p in modules.items()
    }
    problems = layer_violations(modules, graph)
    assert any("longctx.packer.run (layer 2) imports longctx.trainer.train (layer 3)" in p for p in problems)
    assert any("imports the roof (longctx.cli)" in p for p in problems)
    assert len(problems) == 2
    assert find_cycles(graph) == [["longctx.packer.run", "longctx.trainer.train", "longctx.packer.run"]]
    assert [p.split(": ", 1)[1] for p in old_name_imports(modules)] == ["imports packer (use longctx.packer)"]


# --- the trainer's parts ------------------------------------------------------------------------------------

TRAINER_PARTS = ("attention", "models", "parallel", "evaluation", "planning")
"""The trainer's sub-packages. Each is one part of it: ring attention, the models, parallelism (mesh,
process groups, FSDP2, the zigzag split), evaluation, planning; the modules beside them run training."""


def part_of(module: str) -> str:
    """The trainer part a trainer module belongs to: its sub-package, or itself for a module beside them."""
    rest = module.removeprefix("longctx.trainer.").split(".")
    return rest[0] if rest[0] in TRAINER_PARTS else module


def part_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The trainer's import graph with each sub-package contracted to one node."""
    parts: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        if not module.startswith("longctx.trainer."):
            continue
        node = parts.setdefault(part_of(module), {})
        for target, line in edges.items():
            if target.startswith("longctx.trainer.") and part_of(target) != part_of(module):
                node.setdefault(part_of(target), line)
    return parts


def test_the_trainer_parts_import_one_way() -> None:
    """No two trainer parts import each other, even through other modules: the models know nothing of
    parallelism, evaluation or planning, and ring attention knows nothing of the models."""
    _, graph = import_graph()
    parts = part_graph(graph)
    cycles = find_cycles(parts)
    assert not cycles, "trainer parts in a cycle: " + "; ".join(" -> ".join(c) for c in cycles)
    assert set(parts["attention"]) == set()
    assert set(parts["models"]) <= {"attention"}


def test_the_trainer_part_check_catches_a_cycle_through_a_module() -> None:
    graph = {
        "longctx.trainer.models.decoder": {"longctx.trainer.train": 1},
        "longctx.trainer.train": {"longctx.trainer.parallel.mesh": 1},
        "longctx.trainer.parallel.mesh": {"longctx.trainer.models.shape": 1},
        "longctx.trainer.models.shape": {},
    }
    assert find_cycles(part_graph(graph)) == [
        ["longctx.trainer.train", "parallel", "models", "longctx.trainer.train"]
    ]
