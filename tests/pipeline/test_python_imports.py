"""``python_imports`` against an independent reference (every import node of the tree outside functions
and ``TYPE_CHECKING`` bodies, in source order) over the running interpreter's standard library,
and against hand-written expectations on hostile sources (strings, continuations, odd whitespace,
every kind of block, syntax errors, deep nesting, text that is not UTF-8), and the garbage collector
left as it was found.
"""

from __future__ import annotations

import ast
import gc
import sysconfig
import warnings
from pathlib import Path

import pytest

from longctx.pipeline.readers.code_order import PythonImport, python_imports
from longctx.pipeline.readers.code_order.python import outline, parsed_imports


def _reference(source: str) -> list[PythonImport]:
    """The load-time imports found another way than ``python_imports``'s walk of statement blocks:
    every import node of the whole tree (``ast.walk``) that is not inside a function or in the body of
    an ``if TYPE_CHECKING:``, in source order (line, then column)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return []
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hidden.update(id(inner) for inner in ast.walk(node))
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in (
            getattr(node.test, "id", ""),
            getattr(node.test, "attr", ""),
        ):
            hidden.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    imports = (ast.Import, ast.ImportFrom)
    visible = [n for n in ast.walk(tree) if isinstance(n, imports) and id(n) not in hidden]
    found: list[PythonImport] = []
    for node in sorted(visible, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            found.extend(PythonImport(alias.name, 0, ()) for alias in node.names)
        else:
            found.append(PythonImport(node.module or "", node.level, tuple(a.name for a in node.names)))
    return found


def test_same_imports_as_the_reference_over_the_standard_library() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.relative_to(stdlib).parts)
    paths = paths[::3]  # every third file (the test folder's syntax errors among them): ~5 s, not 15
    assert len(paths) > 400
    compared = with_imports = 0
    for path in paths:
        try:
            source = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        expected = _reference(source)
        assert python_imports(source) == expected, path
        compared += 1
        with_imports += bool(expected)
    assert compared > 400 and with_imports > 350


def _modules(source: str) -> list[str]:
    return [imp.module for imp in python_imports(source)]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # strings and comments
        ('"""\nimport in_docstring\n"""\nimport real\n', ["real"]),
        ("x = 'import a'  # import b\ns = '''\nfrom c import d\n'''\n", []),
        ('def f():\n    """\nimport at_column_0_in_a_function_docstring\n"""\nimport after\n', ["after"]),
        ("x = f'{1}' \"import a\"\n", []),
        # continuations, semicolons, whitespace
        ("import \\\n    a\nfrom b \\\n  import (c,\n  d)\n", ["a", "b"]),
        ("x = 1; import a; from b import c\n", ["a", "b"]),
        ("\fimport a\n\x0cfrom b import c\n", ["a", "b"]),
        ("if x:\n\timport a\nelse:\n\t\timport b\n", ["a", "b"]),
        ("import a\r\nif x:\r\n    import b\r\n", ["a", "b"]),
        ("# -*- coding: latin-1 -*-\nimport a\n", ["a"]),
        ("\ufeffimport a\n", []),  # a BOM inside a str is a character, and not a valid one
        # blocks that run at load time
        ("class A:\n    import a\n    class B:\n        import b\n", ["a", "b"]),
        (
            "try:\n    import a\nexcept E:\n    import b\nelse:\n    import c\nfinally:\n    import d\n",
            list("abcd"),
        ),
        ("with x:\n    import a\nfor i in y:\n    import b\nelse:\n    import c\n", ["a", "b", "c"]),
        ("while x:\n    import a\nelse:\n    import b\nasync_ = 1\n", ["a", "b"]),
        ("match x:\n    case 1:\n        import a\n    case _:\n        import b\n", ["a", "b"]),
        ("if x: import a\nclass C: import b\n", ["a", "b"]),
        # blocks that do not
        ("def f():\n    import a\n    class C:\n        import b\nasync def g():\n    import c\n", []),
        ("class A:\n    def f(self):\n        import a\n    import b\n", ["b"]),
        ("@dec\ndef f(): import a\nimport b\n", ["b"]),
        ("if TYPE_CHECKING:\n    import a\nelif x:\n    import b\nelse:\n    import c\n", ["b", "c"]),
        ("if typing.TYPE_CHECKING:\n    import a\nif not TYPE_CHECKING:\n    import b\n", ["b"]),
        ("if TYPE_CHECKING and x:\n    import a\n", ["a"]),
        ("f = lambda: __import__('a')\nimportlib.import_module('b')\n", []),
        # source that does not parse has no imports, wherever the error is
        ("import a\nif x:\n  import b\n    import c\n", []),
        ("import a\nx = 1\0\n", []),
        ("import a\nx = '\udcff'\n", []),  # a lone surrogate: not encodable as UTF-8
        ("import a\nx = " + "(" * 300 + ")" * 300 + "\n", []),
        ("import a\nx = " + "-" * 100_000 + "1\n", []),
        ("import a\nx = a" + ".b" * 100_000 + "\n", []),
    ],
)
def test_hostile_sources(source: str, expected: list[str]) -> None:
    assert _modules(source) == expected
    assert python_imports(source) == _reference(source)


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("source", ["import a\n", "def (:\n", "x = " + "-" * 100_000 + "1\n"])
def test_garbage_collector_left_as_it_was(enabled: bool, source: str) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        python_imports(source)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize(
    "source",
    [
        "import a\ndef f():\n    print 'python 2'\n",
        "import a\nclass C:\n    def f(self):\n        return (\n",
        "import a\ndef f():\n    x = " + "lambda: " * 100_000 + "0\n",
    ],
)
def test_a_broken_function_body_does_not_hide_the_module_imports(source: str) -> None:
    """Function bodies are not parsed (they hold no load-time import): a syntax error, an unclosed
    bracket or nesting too deep inside one leaves the module's imports found, where parsing the whole
    file finds none."""
    assert _modules(source) == ["a"]
    assert parsed_imports(source) == _reference(source) == []


OUTLINE_CASES = {
    "strings holding code": '''
import a
TEXT = """
def not_a_function():
import not_an_import
"""
def f(x=\'):\', y="#"):
    s = \'\'\'
import not_load_time
\'\'\'
    return rb"\\\\" + f"{x!r}" + u\'\\\'\'
import b  # a comment with a quote " and a bracket (
''',
    "dedented continuation lines in a body": """
def f():
    x = call(
1, 2)
    y = 1 + \\
2
    return {
'k': x}
import c
""",
    "multi-line headers, annotations, lambdas and decorators": """
import typing
@decorator(arg={1: 2})
def f(a: int = (lambda: 1)(),
      b: dict[str, int] = {'x': 1},
) -> typing.Callable[[int], int]:
    import inside
    return a
async def g(): import also_inside
class K:
    import in_class
    def method(self):
        def nested():
            import deep
        import inside_method
    if TYPE_CHECKING:
        import typing_only
    import after_method
import d
""",
    'one-line functions, tabs, if"x" and the end of the text': (
        'import e\nif"x" in y: import f\ndef g(): return 1\nclass T:\n\tdef h(self): pass\n'
        "\timport g\ndef last():\n    return 2"
    ),
}


@pytest.mark.parametrize("name", sorted(OUTLINE_CASES))
def test_the_outline_keeps_what_the_scan_must_not_be_fooled_by(name: str) -> None:
    """Texts that a line scan misreads unless it follows literals, comments, brackets, backslashes
    and indentation: the outline parses, and its imports are the reference's of the whole file."""
    source = OUTLINE_CASES[name]
    assert outline(source) is not None
    assert python_imports(source) == _reference(source) != []
