"""The import rules of ARCHITECTURE.md §3, checked on every module of `relax/`.

A module's imports (including lazy ones inside functions) may only reach the packages its
layer is allowed to use. Fails with the file, line and the rule it breaks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "relax"

# layer -> relax packages it must not import (checked by prefix).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "relax.config": ("relax.algorithms", "relax.core", "relax.components", "relax.engine", "relax.backends",
                     "relax.distributed", "relax.entrypoints", "torch", "ray"),
    "relax.algorithms": ("relax.config", "relax.core", "relax.components", "relax.engine", "relax.backends",
                         "relax.distributed", "relax.entrypoints", "relax.utils", "ray", "megatron", "sglang"),
    "relax.types": ("relax.core", "relax.components", "relax.engine", "relax.backends", "relax.distributed"),
    "relax.utils": ("relax.core", "relax.components", "relax.engine", "relax.backends", "relax.distributed",
                    "relax.entrypoints"),
    "relax.distributed": ("relax.components", "relax.engine", "relax.core", "relax.backends", "relax.entrypoints"),
    "relax.engine": ("relax.components", "relax.core", "relax.entrypoints", "megatron", "relax.backends.fsdp",
                     "relax.backends.hf", "relax.backends.megatron", "relax.backends.sglang"),
    "relax.components": ("relax.core", "relax.entrypoints", "megatron", "sglang"),
    "relax.core": ("relax.entrypoints", "megatron", "sglang"),
}
BACKENDS = ("fsdp", "hf", "megatron", "sglang")
for _b in BACKENDS:
    FORBIDDEN[f"relax.backends.{_b}"] = (
        "relax.components", "relax.engine", "relax.core", "relax.entrypoints",
        *(f"relax.backends.{o}" for o in BACKENDS if o != _b))


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def layer_of(module: str) -> str | None:
    best = None
    for layer in FORBIDDEN:
        if (module == layer or module.startswith(layer + ".")) and (best is None or len(layer) > len(best)):
            best = layer
    return best


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_module_respects_layer_import_rules(path: Path) -> None:
    module = module_name(path)
    layer = layer_of(module)
    if layer is None:
        return
    bad = [f"{path}:{line} imports {name} ({layer} must not import {prefix})"
           for line, name in imports_of(path)
           for prefix in FORBIDDEN[layer] if name == prefix or name.startswith(prefix + ".")]
    assert not bad, "\n".join(bad)


def test_rules_cover_every_top_level_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    covered = {layer.split(".")[1] for layer in FORBIDDEN}
    assert packages - covered <= {"entrypoints", "backends"}, packages - covered
