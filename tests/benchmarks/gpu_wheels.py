"""Wheels the GPU suite needs on a machine that has PyTorch but cannot install anything (``make gpu-wheels``).

The lent GPU machine has Python 3.12 with PyTorch, Triton, numpy, pyarrow, tokenizers, safetensors, xxhash,
pyyaml and tqdm, but not pydantic (which the trainer's config and the shard format use), datatrove
(which the trainer never imports) or the ``gpu`` extra's packages. ``download`` fetches the missing
packages for CPython 3.12 on manylinux x86_64 (``--no-deps``: each one is named in ``WHEELS``; liger-kernel
for ``train.kernels.fused``; flash-attn-4 does not fit, see ``NOT_CARRIED``) and builds this checkout's own
wheel into the same folder; ``check`` verifies the folder: one version of each package, every wheel
installable on that machine's tags, and every requirement of every wheel met by another wheel or by
a package the machine has (``DEVICE_PACKAGES``), so ``pip install --no-deps`` there leaves nothing out.
It also checks that the working tree that travels to the machine (tracked and untracked files that git
does not ignore, plus the carried wheel folder) stays under the 64 MiB limit.

    python tests/benchmarks/gpu_wheels.py download [--dest .whl]
    python tests/benchmarks/gpu_wheels.py check [--dest .whl]
"""

from __future__ import annotations

import argparse
import email.parser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
WHEELS = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    # The machine has typing-extensions, in a version nobody has read; pydantic-core needs a recent one.
    "typing-extensions": "4.16.0",
    # The gpu extra's fused kernels (train.kernels.fused): pure Python over the machine's torch and triton.
    "liger-kernel": "0.8.5",
}
"""Packages carried as wheels, pinned to the versions the project's own tests run with (liger-kernel: the
version the ``gpu`` extra was written against)."""

NOT_CARRIED = {
    "flash-attn-4": "its CuTe DSL needs nvidia-cutlass-dsl-libs-cu12 or -cu13 (a 92 MB wheel, 61 MiB even as "
    "xz -9), over the 64 MiB one device call carries with the working tree; the suite reports "
    "FlashAttention-4 as not installed there",
}
"""Packages of the ``gpu`` extra that do not travel, and why."""

DEVICE_PACKAGES = frozenset(
    canonicalize_name(name)
    for name in (
        "torch",
        "numpy",
        "pyarrow",
        "tokenizers",
        "safetensors",
        "transformers",
        "huggingface-hub",
        "pyyaml",
        "xxhash",
        "tqdm",
        "packaging",
        "filelock",
        "fsspec",
        "jinja2",
        "markupsafe",
        "networkx",
        "sympy",
        "mpmath",
        "setuptools",
        "triton",
        "matplotlib",
        "requests",
        "regex",
        "typing-extensions",
    )
)
"""Packages the lent H200 machine has (its image's package list, as documented for this workplace in
2026-11), among those the suite or the wheels' requirements name."""

NOT_NEEDED = {
    "datatrove": "curation only: the trainer imports without it (tests/cli/test_architecture.py)",
    "orjson": "curation only",
    "multiprocess": "curation and packing only: the stage runner's pools (longctx.core.workers)",
    "datasets": "tests only",
}
"""longctx's own requirements that the GPU suite never imports, so they need not travel."""

TREE_LIMIT = 64 * 2**20


def download(dest: Path) -> list[Path]:
    """Fetch ``WHEELS`` for the machine's Python and platform, build this checkout's wheel, into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: stale wheels would make two
        old.unlink()
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
    ]
    subprocess.run([*command, *(f"{name}=={version}" for name, version in WHEELS.items())], check=True)
    build = Path(shutil.copytree(REPO, dest / "build-longctx", ignore=_ignore_for_build))
    try:  # built from a copy: setuptools writes build/ and *.egg-info beside the sources
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(build)], check=True
        )
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return sorted(dest.glob("*.whl"))


def _ignore_for_build(folder: str, names: list[str]) -> set[str]:
    skip = {".git", ".venv", ".whl", "runs", "build", "dist", ".pytest_cache", "__pycache__", ".hypothesis"}
    return {name for name in names if name in skip or name.endswith(".egg-info")}


def device_tags() -> set[Tag]:
    """Tags a wheel may carry to install on CPython 3.12, manylinux x86_64."""
    tags = {Tag(interpreter, "none", "any") for interpreter in ("py3", "py312", "cp312")}
    for platform in (*PLATFORMS, "linux_x86_64"):
        tags |= {Tag("cp312", abi, platform) for abi in ("cp312", "abi3", "none")}
        tags |= {Tag(interpreter, "none", platform) for interpreter in ("py3", "cp312")}
    return tags


def requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` entries of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return [Requirement(value) for value in metadata.get_all("Requires-Dist") or []]


def check(dest: Path) -> list[str]:
    """Problems of the wheel folder and of the travelling tree (empty when ready); prints a summary."""
    problems: list[str] = []
    wheels = sorted(dest.glob("*.whl"))
    found: dict[str, tuple[str, Path]] = {}
    tags = device_tags()
    for wheel in wheels:
        name, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        if name in found:
            problems.append(f"two versions of {name}: {found[name][1].name} and {wheel.name}")
        found[name] = (str(version), wheel)
        if not wheel_tags & tags:
            problems.append(f"{wheel.name} does not install on CPython {PYTHON_VERSION} manylinux x86_64")
        print(f"  {wheel.name:70s} {wheel.stat().st_size / 2**20:6.2f} MiB")
    wanted = {canonicalize_name(name): version for name, version in WHEELS.items()} | {"longctx": None}
    for name, version in wanted.items():
        if name not in found:
            problems.append(f"missing wheel: {name}" + (f"=={version}" if version else " (this checkout)"))
        elif version and found[name][0] != version:
            problems.append(f"{found[name][1].name}: expected version {version}")
    environment = {
        **default_environment(),
        "python_version": PYTHON_VERSION,
        "python_full_version": f"{PYTHON_VERSION}.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    for _, wheel in found.values():
        for requirement in requirements(wheel):
            required = canonicalize_name(requirement.name)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if required in found:
                if not requirement.specifier.contains(found[required][0], prereleases=True):
                    problems.append(f"{wheel.name} needs {requirement}, the folder has {found[required][0]}")
            elif required not in DEVICE_PACKAGES and required not in NOT_NEEDED:
                problems.append(f"{wheel.name} needs {requirement}: neither carried nor on the machine")
    size = sum(wheel.stat().st_size for wheel in wheels)
    for name, why in NOT_CARRIED.items():
        print(f"  not carried: {name}: {why}")
    tree = travelling_tree_bytes()
    print(
        f"  {len(wheels)} wheels, {size / 2**20:.2f} MiB; travelling tree with them "
        + (
            "unknown (no git)"
            if tree is None
            else f"{(tree + size) / 2**20:.2f} MiB of {TREE_LIMIT / 2**20:.0f}"
        )
    )
    if tree is not None and tree + size > TREE_LIMIT:
        problems.append(
            f"the working tree plus wheels is {(tree + size) / 2**20:.1f} MiB, over the 64 MiB limit"
        )
    return problems


def travelling_tree_bytes() -> int | None:
    """Bytes of the files a device call sends: tracked, and untracked but not ignored (None without git)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = {REPO / name for name in listed.decode().split("\0") if name}
    return sum(path.stat().st_size for path in paths if path.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("download", "check"))
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    args = parser.parse_args(argv)
    if args.command == "download":
        download(args.dest)
    problems = check(args.dest)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
