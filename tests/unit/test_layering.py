"""The package's layering (ARCHITECTURE.md, "Layout"), read from the import statements.

Every ``import`` counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import headrace

ROOT = pathlib.Path(headrace.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute module names ``path`` imports (``from headrace import units`` gives
    ``headrace.units``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "headrace":
                out.update(f"headrace.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return out


def _headrace_packages(package: str) -> dict[str, set[str]]:
    """For each module of ``headrace.<package>``: the other headrace top-level names it
    imports (``runtime``, ``units``, ...; ``__init__`` for ``import headrace``, the public
    API, which imports the runtime)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = {"__init__" if m == "headrace" else m.split(".")[1] for m in _imports(path)
                 if m == "headrace" or m.startswith("headrace.")}
        out[str(path.relative_to(ROOT))] = names - {package}
    return out


@pytest.mark.parametrize("package, allowed", [
    ("pipeline", {"errors"}),
    ("planner", {"pipeline", "profiler", "telemetry", "units", "errors", "resources"}),
    ("profiler", {"pipeline", "units", "errors", "user_frame"}),
])
def test_a_lower_layer_imports_no_higher_one(package: str, allowed: set[str]) -> None:
    bad = {m: sorted(n - allowed) for m, n in _headrace_packages(package).items() if n - allowed}
    assert not bad, f"{package} may import only {sorted(allowed)} of headrace: {bad}"


def test_the_package_walk_sees_the_imports_it_checks() -> None:
    # the checks above would pass on an empty walk: it must find the known imports
    assert "pipeline" in _headrace_packages("planner")["planner/order.py"]
    assert _headrace_packages("runtime")["runtime/monitor.py"] >= {"profiler"}
    assert _headrace_packages("cli")["cli/profile.py"] >= {"__init__", "planner"}


@pytest.mark.parametrize("library, owners", [
    ("ray", {"remote/ray_backend.py", "remote/actor.py"}),
    ("redis", {"cache/redis_backend.py"}),
])
def test_an_optional_dependency_is_imported_in_its_backend_only(library: str,
                                                                owners: set[str]) -> None:
    # the benchmark harness starts clusters and servers of its own; the library does not
    importers = {
        str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] != "bench"
        and any(m == library or m.startswith(library + ".") for m in _imports(p))
    }
    assert importers == owners
