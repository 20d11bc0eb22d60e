"""The faster ``malloc`` of ``longctx curate`` and ``longctx pack`` (``longctx.core.allocator``): which
library is chosen, when the command executes itself again with it, and that the outputs are the same
bytes with it as with the system's allocator (real runs, when mimalloc or jemalloc is installed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx import cli
from longctx.core import allocator
from longctx.core.allocator import (
    ENV,
    MARKER,
    allocator_to_preload,
    find_allocator,
    is_command_process,
    keep_from_children,
    library_dirs,
)
from longctx.core.errors import ConfigError
from longctx.pipeline.bpe import train_bpe
from tests.pipeline.test_curate import prose, wrap

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLED = find_allocator(library_dirs())
needs_allocator = pytest.mark.skipif(
    INSTALLED is None or not sys.platform.startswith("linux"),
    reason="no mimalloc or jemalloc in the system's library folders (Debian: apt install libmimalloc2.0)",
)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_find_allocator_prefers_mimalloc_then_the_first_folder(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    jemalloc = touch(first / "libjemalloc.so.2")
    assert find_allocator([first, second]) == jemalloc
    mimalloc = touch(second / "libmimalloc.so.2")
    assert find_allocator([first, second]) == mimalloc  # the library's rank before the folder's
    assert find_allocator([tmp_path / "none"]) is None
    (second / "libmimalloc.so").mkdir()  # a folder by that name is not a library
    assert find_allocator([second / "x"]) is None


def test_library_dirs_put_conda_first_and_name_the_system_folders(monkeypatch) -> None:
    dirs = library_dirs({"CONDA_PREFIX": "/opt/env"})
    assert dirs[0] == Path("/opt/env/lib")
    assert {Path("/usr/lib"), Path("/usr/local/lib"), Path("/usr/lib64")} <= set(dirs)
    assert len(dirs) == len(set(dirs))
    assert Path("/opt/env/lib") not in library_dirs({})


def test_the_choice_of_library(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    lib = touch(tmp_path / "lib" / "libmimalloc.so.2.0")
    (tmp_path / "lib" / "libmimalloc.so.2").symlink_to("libmimalloc.so.2.0")
    dirs = [tmp_path / "lib"]
    # auto: the installed one, as the loader maps it (the link's target)
    assert allocator_to_preload({}, dirs) == lib.resolve()
    assert allocator_to_preload({ENV: "auto"}, dirs) == lib.resolve()
    assert allocator_to_preload({ENV: " "}, dirs) == lib.resolve()
    assert allocator_to_preload({}, [tmp_path / "empty"]) is None
    # never twice, never against the user's choice
    assert allocator_to_preload({ENV: "system"}, dirs) is None
    assert allocator_to_preload({MARKER: str(lib)}, dirs) is None
    assert allocator_to_preload({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, dirs) is None
    assert allocator_to_preload({"LD_PRELOAD": "/x/libtcmalloc_minimal.so.4:/y/libfoo.so"}, dirs) is None
    assert allocator_to_preload({"LD_PRELOAD": "/y/libfoo.so"}, dirs) == lib.resolve()
    # a path: that library, whatever is installed
    other = touch(tmp_path / "elsewhere" / "libjemalloc.so.2")
    assert allocator_to_preload({ENV: str(other)}, dirs) == other.resolve()
    missing = tmp_path / "nope.so"
    with pytest.raises(ConfigError, match=rf"^{ENV}={re.escape(str(missing))}: no such library file"):
        allocator_to_preload({ENV: str(missing)}, dirs)
    with pytest.raises(ConfigError, match=rf"^{ENV}=mimalloc: no such library file \(use auto, system"):
        allocator_to_preload({ENV: "mimalloc"}, dirs)  # a typo is refused even where nothing is preloaded
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator_to_preload({}, dirs) is None


def test_only_the_command_itself_executes_again(monkeypatch) -> None:
    monkeypatch.setattr(
        sys, "orig_argv", ["/venv/bin/python", "/venv/bin/longctx", "curate", "--config", "c.yaml"]
    )
    assert is_command_process(["curate", "--config", "c.yaml"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "longctx.cli", "curate", "--config", "c.yaml"])
    assert is_command_process(["curate", "--config", "c.yaml"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest", "tests/core"])
    assert not is_command_process(["curate", "--config", "c.yaml"])
    assert not is_command_process([])


def test_main_called_with_arguments_never_executes_again(tmp_path: Path, monkeypatch, capsys) -> None:
    """A session (or a test) calling the CLI's main keeps its own process: were it executed again, this
    test's process would be replaced by the command's."""
    calls: list[tuple] = []
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    monkeypatch.setenv(ENV, str(touch(tmp_path / "libmimalloc.so.2")))
    monkeypatch.delenv(MARKER, raising=False)
    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump({"output": str(tmp_path / "run"), "context": {"original": 32, "target": 64}})
    )
    assert cli.main(["curate", "--config", str(tmp_path / "c.yaml"), "--status"]) == 0
    assert calls == []
    # the command line itself does: the interpreter again, with the library preloaded and the marker set
    monkeypatch.setattr(sys, "argv", ["longctx", "curate", "--config", str(tmp_path / "c.yaml"), "--status"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "longctx.cli", *sys.argv[1:]])
    assert cli.main() == 0  # the patched execve returned: the command ran on in this process
    ((exe, args, env),) = calls
    assert exe == sys.executable and args == [sys.executable, *sys.orig_argv[1:]]
    assert env["LD_PRELOAD"].split(":")[0] == str((tmp_path / "libmimalloc.so.2").resolve())
    assert env[MARKER] == env["LD_PRELOAD"].split(":")[0]


def test_a_bad_choice_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump({"output": str(tmp_path / "run"), "context": {"original": 32, "target": 64}})
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), ENV: str(tmp_path / "missing.so")}
    env.pop(MARKER, None)
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"longctx curate: {ENV}={tmp_path / 'missing.so'}: no such library file (use auto, system or the "
        "path of a shared library such as /usr/lib/x86_64-linux-gnu/libmimalloc.so.2)"
    ]
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_jobs_elsewhere_do_not_inherit_the_library(monkeypatch) -> None:
    monkeypatch.setenv(MARKER, "/usr/lib/libmimalloc.so.2.0")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libmimalloc.so.2.0:/opt/libother.so")
    keep_from_children()
    assert os.environ["LD_PRELOAD"] == "/opt/libother.so" and MARKER not in os.environ
    monkeypatch.setenv(MARKER, "/usr/lib/libmimalloc.so.2.0")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libmimalloc.so.2.0")
    keep_from_children()
    assert "LD_PRELOAD" not in os.environ and MARKER not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "/opt/libother.so")
    keep_from_children()  # nothing of ours: the user's preload stays
    assert os.environ["LD_PRELOAD"] == "/opt/libother.so"


def test_the_note_names_only_a_library_that_is_mapped(monkeypatch) -> None:
    monkeypatch.setattr(allocator, "STARTED_WITH", "/no/such/libmimalloc.so.2.0")
    assert allocator.preloaded_allocator() is None and allocator.allocator_note() == ""
    maps = Path("/proc/self/maps").read_text().splitlines()
    mapped = next(line.split()[-1] for line in maps if line.split()[-1].endswith(".so"))
    monkeypatch.setattr(allocator, "STARTED_WITH", mapped)
    assert allocator.allocator_note() == f"; malloc: {mapped}"
    monkeypatch.setattr(allocator, "STARTED_WITH", None)
    assert allocator.allocator_note() == ""


def _run(command: str, config: Path, choice: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), ENV: choice}
    env.pop(MARKER, None)
    env.pop("LD_PRELOAD", None)
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", command, "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@needs_allocator
def test_curate_and_pack_with_the_allocator_write_the_same_bytes(tmp_path: Path) -> None:
    """The command executes itself with the installed allocator (its closing line names the library
    it has mapped), and its documents, ledger, stats and shards equal those of the same run on the
    system's allocator, byte for byte."""
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    for i in range(4):
        (books / f"book{i}.txt").write_text(wrap(prose(200 + i, 3000), 70))
    code = tmp_path / "input" / "code" / "repo" / "pkg"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("from pkg.core import run\n")
    (code / "core.py").write_text(
        "import os\n\n\ndef run():\n    " + "\n    ".join(prose(7, 400).split(". ")) + "\n"
    )
    tokenizer = tmp_path / "tokenizer.json"
    train_bpe([prose(s, 1500) for s in range(3)], 300, tokenizer)
    outputs = {}
    for choice in ("auto", "system"):
        config = tmp_path / f"{choice}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "output": str(tmp_path / choice),
                    "context": {"original": 32, "target": 64},
                    "tokenizer": {"path": str(tokenizer)},
                    "curate": {
                        "input": str(tmp_path / "input"),
                        "executor": {"tasks": 2, "workers": 2},
                    },
                    "pack": {"seq_lens": [64]},
                }
            )
        )
        closing = [_run("curate", config, choice), _run("pack", config, choice)]
        named = [re.search(r"; malloc: (\S+)\)$", line) for line in closing]
        if choice == "auto":
            assert all(m and Path(m.group(1)) == INSTALLED.resolve() for m in named), closing
        else:
            assert not any(named), closing
        root = tmp_path / choice
        outputs[choice] = {
            p.relative_to(root): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and "work" not in p.relative_to(root).parts and p.suffix != ".png"
        }
    assert any(p.parts[0] == "documents" for p in outputs["auto"])
    assert any(p.parts[0] == "shards" and p.suffix == ".arrow" for p in outputs["auto"])
    assert outputs["auto"].keys() == outputs["system"].keys()
    different = [p for p in outputs["auto"] if outputs["auto"][p] != outputs["system"][p]]
    assert different == []


@pytest.mark.parametrize("command", ["curate", "pack"])
@pytest.mark.parametrize("kind", ["local", "slurm", "ray"])
def test_jobs_run_by_another_executor_do_not_inherit_it(
    command: str, kind: str, tmp_path: Path, monkeypatch
) -> None:
    """The command takes the library out of the environment when its stages run elsewhere (sbatch
    exports the submitter's environment to the jobs), and leaves it for local workers."""
    executor = {"kind": kind, "tasks": 2} | ({"slurm": {"partition": "debug"}} if kind == "slurm" else {})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "output": str(tmp_path / "run"),
                "context": {"original": 32, "target": 64},
                "curate": {"executor": executor},
                "pack": {"seq_lens": [64], "executor": executor},
            }
        )
    )
    monkeypatch.setenv(MARKER, "/opt/lib/libmimalloc.so.2.0")
    monkeypatch.setenv("LD_PRELOAD", "/opt/lib/libmimalloc.so.2.0")
    assert cli.main([command, "--config", str(cfg), "--status"]) == 0
    if kind == "local":
        assert os.environ[MARKER] == os.environ["LD_PRELOAD"] == "/opt/lib/libmimalloc.so.2.0"
    else:
        assert MARKER not in os.environ and "LD_PRELOAD" not in os.environ
