"""The import rules of docs/architecture.md ([tool.importlinter] in pyproject.toml): the tree
keeps them, and a copy of the tree with one upward import, or one new circle, breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(project: Path, src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}  # the tree under test, ahead of the installed one
    return subprocess.run(
        [str(LINT), "--no-cache", str(project / "pyproject.toml")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_keeps_the_import_rules() -> None:
    done = _lint(ROOT, ROOT / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


# Packages whose modules sit in different layers: each of these __init__ modules stays empty.
SPLIT_PACKAGES = {"flowyard"}


def test_every_module_is_in_a_layer() -> None:
    """A module outside every layer would escape the rules: a new one must be placed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    src = ROOT / "src"
    modules = set()
    for path in (src / "flowyard").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    outside = sorted(
        m for m in modules - SPLIT_PACKAGES if not any(m == n or m.startswith(n + ".") for n in named)
    )
    assert not outside, f"modules in no layer of [tool.importlinter]: {outside}"
    for package in SPLIT_PACKAGES:
        init = src / package.replace(".", "/") / "__init__.py"
        assert "import" not in init.read_text(), f"{init} must stay empty (its modules are in layers)"


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    shutil.copytree(
        ROOT / "src" / "flowyard", project / "src" / "flowyard", ignore=shutil.ignore_patterns("__pycache__")
    )
    return project


def _with_line(copy: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    path = copy / "src" / (module.replace(".", "/") + ".py")
    original = path.read_text()
    path.write_text(original + f"\n{line}\n")
    try:
        return _lint(copy, copy / "src")
    finally:
        path.write_text(original)


def test_the_copy_keeps_them_untouched(copy: Path) -> None:
    done = _lint(copy, copy / "src")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        # the queue reaching up into the triggers
        ("flowyard.queue.store", "from flowyard.triggers import scheduler", "flowyard.triggers.scheduler"),
        # the database layer reaching up into a domain's service
        ("flowyard.db.session", "import flowyard.flows.service", "flowyard.flows.service"),
        # a domain reaching up into the runtime
        ("flowyard.logs.append", "import flowyard.runtime.worker", "flowyard.runtime.worker"),
        # the HTTP kit reaching up into identity (the caller is iam/deps.py's)
        ("flowyard.api.deps", "from flowyard.iam import tokens", "flowyard.iam.tokens"),
        # the queue's acceptance reaching up into the webhook door (its check is passed in)
        ("flowyard.queue.accept", "import flowyard.webhooks.signature", "flowyard.webhooks.signature"),
    ],
)
def test_an_upward_import_breaks_the_layers(copy: Path, module: str, line: str, named: str) -> None:
    done = _with_line(copy, module, line)
    assert done.returncode != 0
    assert "flowyard layers (docs/architecture.md) BROKEN" in done.stdout
    assert f"{module} -> {named}" in done.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # iam.users imports iam.models; the reverse closes a circle within one layer.
        ("flowyard.iam.models", "import flowyard.iam.users"),
        # the built-ins import the registry; the registry takes them as Registry.load(fallback).
        ("flowyard.components.registry", "from flowyard.components import builtins"),
    ],
)
def test_a_circle_inside_a_package_breaks_the_rules(copy: Path, module: str, line: str) -> None:
    done = _with_line(copy, module, line)
    assert done.returncode != 0
    assert "no circles inside a package BROKEN" in done.stdout


def test_the_old_component_api_paths_still_work() -> None:
    """Third-party components import ``flowyard.engine.components`` and ``flowyard.engine.context``
    (examples/flowyard-uppercase): the compatibility package re-exports the very same objects."""
    from flowyard.components import context, registry
    from flowyard.engine import components as old_components
    from flowyard.engine import context as old_context

    assert old_components.Component is registry.Component
    assert old_components.Registry is registry.Registry
    assert old_context.StepContext is context.StepContext
    engine = ROOT / "src" / "flowyard" / "engine"
    assert sorted(p.name for p in engine.glob("*.py")) == ["__init__.py", "components.py", "context.py"]
