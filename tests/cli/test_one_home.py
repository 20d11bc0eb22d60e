"""Each rule that crosses parts is written once: read from the source tree, as a reviewer would grep it.

* The zigzag window rule (``2 x cp`` chunks per window) and the world-size rule (``cp x dp_replicate``
  divides the processes) are computed only in :class:`longctx.trainer.parallel.mesh.MeshShape`: no other
  expression multiplies a ``cp`` by 2 or takes a remainder by a ``cp``.
* The default shard folder training reads (``shards/seq<context.target>``) is derived only in
  ``core/layout.py``.
* The evaluation job takes nothing from the training job's module.

The search is over the syntax tree (code and f-string expressions, not comments or docstrings), so
a reworded copy such as ``length % (cp_size * 2)`` is found too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYER_FOLDERS = ("core", "pipeline", "packer", "trainer", "longctx")


def source_files() -> Iterator[Path]:
    for folder in LAYER_FOLDERS:
        yield from sorted((REPO / folder).rglob("*.py"))


def identifiers(node: ast.AST) -> set[str]:
    """Every variable and attribute name in an expression."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def mentions_cp(node: ast.AST) -> bool:
    """Whether an expression reads a context-parallel size (``cp``, ``cp_size``, ``state.cp_size``...);
    ``cp_rank`` is a position in the ring, not its size."""
    return any(name == "cp" or (name.startswith("cp") and "size" in name) for name in identifiers(node))


def is_two(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 2


def scoped_nodes(node: ast.AST, scope: str = "") -> Iterator[tuple[ast.AST, str]]:
    """Every node below ``node`` with the dotted name of the function or class it is in."""
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}.{child.name}" if scope else child.name
        yield child, inner
        yield from scoped_nodes(child, inner)


def where(predicate) -> set[tuple[str, str]]:
    """``(file, enclosing function)`` of every expression the predicate holds for."""
    places = set()
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, scope in scoped_nodes(tree):
            if predicate(node):
                places.add((path.relative_to(REPO).as_posix(), scope))
    return places


def zigzag_divisor(node: ast.AST) -> bool:
    """``2 * cp`` (either order)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    return (is_two(node.left) and mentions_cp(node.right)) or (is_two(node.right) and mentions_cp(node.left))


def remainder_by_cp(node: ast.AST) -> bool:
    """``x % cp``, ``x % (2 * cp)``, ``x % (cp * dp_replicate)``..."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and mentions_cp(node.right)


def test_the_predicates_find_the_copies_they_are_meant_to_find() -> None:
    def found(source: str, predicate) -> bool:
        return any(predicate(n) for n in ast.walk(ast.parse(source)))

    for copy in ("seq_len % (2 * cp)", "f'{2 * state.cp_size}'", "n // (cp_size * 2)", "x % train.cp"):
        assert found(copy, zigzag_divisor) or found(copy, remainder_by_cp), copy
    for unrelated in ("2 * cp_rank", "2 * self.q_dim", "length % chunks", "'2 * cp in a string'"):
        assert not found(unrelated, zigzag_divisor) and not found(unrelated, remainder_by_cp), unrelated


def test_the_window_and_world_size_rules_live_in_the_mesh_only() -> None:
    assert where(zigzag_divisor) == {("trainer/parallel/mesh.py", "MeshShape.chunks_per_window")}
    assert where(remainder_by_cp) == {
        ("trainer/parallel/mesh.py", "MeshShape.for_world"),
        ("trainer/parallel/mesh.py", "MeshShape.window_splits"),
    }


def test_the_default_training_shards_are_the_layouts() -> None:
    def target_shard_folder(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "shard_folder"
            and any("target" in identifiers(arg) for arg in node.args)
        )

    assert where(target_shard_folder) == {("core/layout.py", "RunLayout.training_shards")}


def test_the_evaluation_job_imports_nothing_from_the_training_job() -> None:
    tree = ast.parse((REPO / "trainer" / "evaluation" / "job.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "longctx.trainer.train" not in imported
