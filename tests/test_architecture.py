"""The import rules of ARCHITECTURE.md §3, checked on every module of `relax/`.

A module's imports (including lazy ones inside functions) may only reach the packages its
layer is allowed to use, and so may the dotted paths it loads by name: a string such as
"relax.backends.sglang.args" passed to `import_object` / `importlib`, or held in a module-level
constant (a registry, a default path), imports that module all the same. Only the registries
(`relax.core.registry` for roles, `relax.backends.registry` for backends) name a component or
a backend by dotted path. Fails with the file, line and the rule it breaks.
"""

from __future__ import annotations

import ast
import re
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
# The backends' shared modules (base Protocols, the registry, what every backend uses) depend on
# no backend in particular: the registry names them by dotted path, loaded where they run.
FORBIDDEN["relax.backends"] = ("relax.components", "relax.engine", "relax.core", "relax.entrypoints",
                               *(f"relax.backends.{b}" for b in BACKENDS))

# What only a registry names by dotted path (STYLE 14: a dotted-string import is for user plugins).
REGISTRIES: dict[str, tuple[str, ...]] = {
    "relax.core.registry": ("relax.components",),
    "relax.backends.registry": tuple(f"relax.backends.{b}" for b in BACKENDS),
}
NAMED_BY_REGISTRY_ONLY = tuple(p for prefixes in REGISTRIES.values() for p in prefixes)
LOADERS = {"import_object", "load_plugin", "import_module", "__import__", "find_spec"}
DOTTED = re.compile(r"relax(\.[A-Za-z_]\w*)+")


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


def _dotted(node: ast.AST) -> list[tuple[int, str]]:
    return [(n.lineno, n.value) for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and DOTTED.fullmatch(n.value)]


def dotted_imports_of(path: Path) -> list[tuple[int, str]]:
    """Dotted `relax.` paths the module loads by name: arguments of a loader call, and strings held
    in a module-level constant (registries, default paths later passed to a loader)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in LOADERS:
                found += [hit for arg in [*node.args, *(k.value for k in node.keywords)] for hit in _dotted(arg)]
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            found += _dotted(node.value)
    return sorted(set(found))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


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


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_module_loads_by_dotted_path_only_what_it_may_import(path: Path) -> None:
    module = module_name(path)
    layer, own = layer_of(module), REGISTRIES.get(module, ())
    dotted = dotted_imports_of(path)
    bad = [f"{path}:{line} loads {name!r} by name ({layer} must not import {prefix})"
           for line, name in dotted for prefix in (FORBIDDEN[layer] if layer else ())
           if _within(name, prefix) and prefix not in own]
    bad += [f"{path}:{line} loads {name!r} by name: only {', '.join(REGISTRIES)} name a component or a backend "
            "(ask the registry)"
            for line, name in dotted for prefix in NAMED_BY_REGISTRY_ONLY
            if _within(name, prefix) and prefix not in own and not _within(module, prefix)]
    assert not bad, "\n".join(bad)


def test_dotted_path_rules_catch_a_string_import_of_a_higher_layer(tmp_path: Path) -> None:
    """The check above sees the shapes a dotted-path import takes (it would have caught config
    loading the sglang backend's argument module by name)."""
    src = tmp_path / "mod.py"
    src.write_text('ARGS = "relax.backends.sglang.args"\n'
                   'OPTIONS = {"hf": "relax.backends.hf.launcher.ENGINE_OPTIONS"}\n'
                   'DOC = "relax.backends.fsdp is named in prose, not loaded"\n'
                   'def f(import_object, importlib):\n'
                   '    import_object("relax.core.registry.ROLES", flag="x")\n'
                   '    importlib.import_module("relax.engine.fleet")\n'
                   '    return "relax.components.actor"\n')
    assert [name for _, name in dotted_imports_of(src)] == [
        "relax.backends.sglang.args", "relax.backends.hf.launcher.ENGINE_OPTIONS", "relax.core.registry.ROLES",
        "relax.engine.fleet"]


def test_rules_cover_every_top_level_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    covered = {layer.split(".")[1] for layer in FORBIDDEN}
    assert packages - covered <= {"entrypoints"}, packages - covered
