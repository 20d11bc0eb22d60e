"""Every fenced block of the README, CONTRIBUTING, docs/ and packer/FORMAT.md runs, or says why not.

A block is one of:

* ``text``: a layout or a formula, not run;
* marked ``<!-- needs: REASON[, REASON] -->`` (the line above it): recorded here as a skip with that
  reason, which must be one of :data:`NEEDS`;
* marked ``<!-- tested-by: tests/path.py::test_name -->``: run by that test (which must exist);
* anything else is run here: ``yaml`` is validated by the real config models (as a whole config,
  or as sections over a minimal one), ``bash`` lines are ``longctx ...`` commands run in-process as
  the console script runs them, ``python`` is executed.

Commands and Python run in a working folder laid out like the repository root: ``configs/`` holds
the real ``corpus_64k.yaml``, ``llama3_8b_64k.yaml`` and ``llama3_8b_128k_staged.yaml``, and a
``demo.yaml`` that is the packaged demo config scaled down (its embedded corpus replaced by a small
``demo_corpus/``, fewer tokenizer merges, synthetic tasks, steps and needles; the same windows, mix,
model, stages and ring), so that the README's commands, written for the demo, run as written in
about a minute. The README's job block
runs first and builds ``runs/demo``; the other blocks run after it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import random
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx.cli import main
from longctx.config import parse_config
from longctx.demo import packaged_config
from tests.packer.test_pack_helpers import WORDS
from tests.readme import README, REPO, Block, blocks, pages, section

NEEDS = {
    "gpu": "a CUDA GPU",
    "s3": "an S3 bucket and its credentials",
    "cluster": "a Slurm or Ray cluster, or several nodes",
    "hub": "downloads from the Hugging Face hub",
    "network": "package downloads",
    "long-run": "minutes or more, or runs until stopped",
    "checkout": "a development checkout (make targets, the test suite, git hooks)",
    "your-files": "your own model, tokenizer or corpus",
    "excerpt": "names (rank, checkpoint...) from the program it is an excerpt of",
}
"""What a block may need instead of being run here, and what each reason means."""

LANGUAGES = ("bash", "python", "yaml", "text")
JOB_HEADING = "Each job, one command"
ALL = [block for page in pages() for block in blocks(page)]


def _job_block() -> Block:
    text = README.read_text(encoding="utf-8")
    part = section(text, JOB_HEADING)
    assert part is not None, f"README has no section {JOB_HEADING!r}"
    (first,) = [b for b in blocks(README) if b.language == "bash" and b.code in part]
    return first


JOB_BLOCK = _job_block()
RUN = [b for b in ALL if not b.marker and b.language != "text"]
RUN_AFTER_JOBS = [b for b in RUN if b.language in ("bash", "python") and b != JOB_BLOCK]


def name(block: Block) -> str:
    return block.name


def marker_parts(block: Block) -> tuple[str, str]:
    kind, _, value = block.marker.partition(":")
    return kind.strip(), value.strip()


# --- the blocks' declarations ----------------------------------------------------------------------


def test_the_readme_opens_with_the_two_quickstart_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_heading = re.search(r"^## (.+)$", text, re.MULTILINE)
    assert first_heading and first_heading.group(1) == "Quickstart"
    quickstart = ALL[0]
    assert quickstart.page == README and quickstart.language == "bash"
    commands = [shlex.split(line, comments=True) for line in quickstart.code.splitlines()]
    assert [c for c in commands if c] == [["make", "demo"], ["make", "test"]]


@pytest.mark.parametrize("block", ALL, ids=name)
def test_every_block_declares_its_language_and_a_known_marker(block: Block) -> None:
    assert block.language in LANGUAGES, f"{block.name}: fence language must be one of {LANGUAGES}"
    if not block.marker:
        return
    kind, value = marker_parts(block)
    if kind == "needs":
        unknown = [r for r in map(str.strip, value.split(",")) if r not in NEEDS]
        assert not unknown, f"{block.name}: unknown needs {unknown}; known: {', '.join(NEEDS)}"
    elif kind == "tested-by":
        path, _, function = value.partition("::")
        module = REPO / path
        assert module.is_file(), f"{block.name}: {path} does not exist"
        defined = {n.name for n in ast.parse(module.read_text(encoding="utf-8")).body if hasattr(n, "name")}
        assert function in defined, f"{block.name}: {path} defines no {function}"
    else:
        pytest.fail(f"{block.name}: unknown marker {block.marker!r} (expected needs: or tested-by:)")


@pytest.mark.parametrize("block", [b for b in ALL if b.marker.startswith("needs")], ids=name)
def test_blocks_that_need_what_a_test_machine_lacks(block: Block) -> None:
    reasons = [r.strip() for r in marker_parts(block)[1].split(",")]
    pytest.skip(f"{block.name} needs {'; '.join(NEEDS.get(r, r) for r in reasons)}")


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors of a page, and its explicit ``<a id=...>`` ones."""
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    return slugs | set(re.findall(r'<a id="([^"]+)"></a>', text))


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_files_and_headings_that_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(REPO)}: link to missing {target}"
        if anchor:
            assert anchor in _anchors(file.read_text(encoding="utf-8")), f"{page.name}: no anchor {target}"


# --- a working folder like the repository root ------------------------------------------------------


def _prose(rng: random.Random, words: int) -> str:
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(words // 9)]
    return "\n".join(lines) + "\n"


def _corpus(root: Path, papers: bool, repos: int = 3) -> None:
    """Books, ``repos`` code repositories, a short ``short_web`` JSONL source and, with ``papers``,
    papers."""
    rng = random.Random(0)
    for i in range(4):
        (root / "books").mkdir(parents=True, exist_ok=True)
        (root / "books" / f"book{i}.txt").write_text(_prose(rng, 2500))
    for i in range(2 if papers else 0):
        (root / "papers").mkdir(exist_ok=True)
        (root / "papers" / f"paper{i}.tex").write_text(
            "\\documentclass{article}\n\\begin{document}\n" + _prose(rng, 1500) + "\\end{document}\n"
        )
    for r in range(repos):
        repo = root / "code" / f"repo{r}"
        repo.mkdir(parents=True)
        for m in range(3):
            functions = [
                f'def f{r}_{m}_{k}(x):\n    """{_prose(rng, 30).strip()}"""\n    return x + {k}\n'
                for k in range(25)
            ]
            (repo / f"mod{m}.py").write_text("\n\n".join(functions))
    (root / "short_web").mkdir()
    rows = [json.dumps({"id": f"r{i}", "text": _prose(rng, rng.randint(40, 200))}) for i in range(40)]
    (root / "short_web" / "rows.jsonl").write_text("\n".join(rows) + "\n")


def scaled_demo_config() -> dict[str, Any]:
    """The packaged demo config with ``demo_corpus`` for the embedded corpus (books, code and a short
    ``anchor`` source, as the embedded corpus has), and smaller sizes."""
    with packaged_config() as path:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    cfg["tokenizer"] |= {"train_vocab_size": 512, "train_sample_bytes": 200_000}
    cfg["curate"] |= {
        "input": "demo_corpus",
        "sources": [
            {
                "name": "anchor",
                "kind": "jsonl",
                "path": "demo_corpus/short_web",
                "min_tokens": 16,
                "max_tokens": 1024,
            }
        ],
    }
    cfg["curate"]["synthetic"]["n_examples"] = 2
    cfg["train"] |= {"holdout_rows": 2, "checkpoint": {"every": 1, "keep": 1}}
    for stage in cfg["train"]["stages"]:
        stage["steps"] = 1
    cfg["eval"] |= {
        "rows": 2,
        "needle": {"lengths": [256, 1024], "depths": [0.0, 1.0], "samples": 2, "max_new_tokens": 4},
    }
    return cfg


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs_root")
    _corpus(root / "my_corpus", papers=True)  # what docs/curation.md reads
    # as in the embedded corpus, code is most of the text, so the mix leaves some repositories out of
    # training: the held-out windows of the demo's short-context guard and gates
    _corpus(root / "demo_corpus", papers=False, repos=12)
    (root / "configs").mkdir()
    for config in ("corpus_64k.yaml", "llama3_8b_64k.yaml", "llama3_8b_128k_staged.yaml"):
        shutil.copyfile(REPO / "configs" / config, root / "configs" / config)
    (root / "configs" / "demo.yaml").write_text(yaml.safe_dump(scaled_demo_config(), sort_keys=False))
    return root


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run_shell(block: Block, folder: Path) -> str:
    """Run each ``longctx ...`` line of a bash block in ``folder``, in-process; the output."""
    out = io.StringIO()
    for line in block.code.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == "longctx" and not {">", "|", "&&", ";"} & set(argv), (
            f"{block.name}: only `longctx ...` lines run here; mark other commands <!-- needs: ... -->"
        )
        with inside(folder), contextlib.redirect_stdout(out):
            status = main(argv[1:])
        assert status == 0, f"{block.name}: `{line}` exited {status}\n{out.getvalue()[-3000:]}"
    return out.getvalue()


@pytest.fixture(scope="session")
def demo_root(workdir: Path) -> tuple[Path, str]:
    """The working folder after the README's job block: curated, packed, trained and evaluated."""
    return workdir, run_shell(JOB_BLOCK, workdir)


# --- running them -------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merge(base[key], value) if both else value
    return merged


@pytest.mark.parametrize("block", [b for b in RUN if b.language == "yaml"], ids=name)
def test_yaml_blocks_are_valid_configs(block: Block, workdir: Path) -> None:
    data = yaml.safe_load(block.code)
    assert isinstance(data, dict), f"{block.name}: not a mapping of config sections"
    base = {"output": "runs/yaml", "context": {"original": 512, "target": 2048}}
    with inside(workdir):
        parse_config(_merge(base, data), block.name)


@pytest.mark.slow
def test_the_readme_job_block_runs(demo_root: tuple[Path, str]) -> None:
    """curate, pack, inspect, train, eval and plan, one after the other, as the README shows them."""
    root, out = demo_root
    run = root / "runs" / "demo"
    assert json.loads((run / "shards" / "seq2048" / "manifest.json").read_text())["rows"] > 0
    assert (run / "shards" / "seq1024" / "manifest.json").is_file()
    assert (run / "train" / "stages" / "2-2048" / "final" / "config.json").is_file()
    summary = json.loads((run / "eval" / "001" / "summary.json").read_text())
    assert [m["label"] for m in summary["models"]] == ["base", "trained"]
    assert "every invariant holds" in out and "KV cache per token" in out


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_AFTER_JOBS, ids=name)
def test_command_and_python_blocks_run(block: Block, demo_root: tuple[Path, str]) -> None:
    root, _ = demo_root
    if block.language == "bash":
        run_shell(block, root)
        return
    with inside(root):
        exec(compile(block.code, block.name, "exec"), {"__name__": "__docs__"})
