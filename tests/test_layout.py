"""The package's layout: no module imports itself back, however far round, at any depth.

Every module under specdec/ is parsed with `ast` (nothing is imported). Every `import` and
`from ... import` statement counts, also inside functions and branches. The edges:
- `import a.b.c` is an edge to `a.b.c`, the module it names;
- `from a.b import c` is an edge to `a.b.c` where that is a module, else to `a.b` (the package's
  `__init__`, which must then define `c`); relative forms are resolved against the importing module;
- the parent packages Python runs on the way (`a`, `a.b`) are not edges: a package's `__init__`
  importing its submodules while a submodule imports a sibling is no circle; it becomes one only
  where the submodule imports a name from the `__init__`.
Only edges inside specdec count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name of every module under the package folder `root` -> its file."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `name` (the module in `path`) imports, by the rule above."""
    is_package = path.name == "__init__.py"
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                keep = len(here) - (node.level - 1)
                assert keep > 0, f"{path}: relative import leaves the package"
                base = ".".join(here[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    edges.add(target)
                elif base in modules:
                    edges.add(base)
    edges.discard(name)
    return edges


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle from every strongly connected part of `graph` that has one (Tarjan), each as the
    path `a -> b -> ... -> a`, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.add(member)
                if member == node:
                    break
            if len(part) > 1:
                parts.append(part)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(cycle_within(part, graph) for part in parts)


def cycle_within(part: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the first (by name) module of one strongly connected part."""
    start = min(part)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & part):
                if nxt == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in {sorted(part)}")


def test_no_import_cycles():
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles in specdec:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_sees_every_module_and_deep_imports():
    graph = import_graph(PACKAGE)
    assert {"specdec", "specdec.cli", "specdec.serve.app"} <= graph.keys()
    # load-test's command imports its client inside `run`; that edge must be there.
    assert "specdec.loadtest.client" in graph["specdec.loadtest.command"]


def write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


@pytest.mark.parametrize("files,expected", [
    # Imports inside a function count; a relative import is resolved.
    ({"pkg/__init__.py": "", "pkg/a.py": "def f():\n    from .b import g\n",
      "pkg/b.py": "import pkg.a\n"}, [["pkg.a", "pkg.b", "pkg.a"]]),
    # `from package import module` is an edge to the module, so an __init__ that imports its
    # submodules, with one submodule importing a sibling, is no cycle.
    ({"pkg/__init__.py": "from pkg import a, b\n", "pkg/a.py": "from pkg import b\n",
      "pkg/b.py": ""}, []),
    # ... but a submodule importing a name its package's __init__ takes from it is one.
    ({"pkg/__init__.py": "from pkg.a import f\n", "pkg/a.py": "from pkg import g\n"},
     [["pkg", "pkg.a", "pkg"]]),
    # Three modules round, found from the first by name; `from .. import` in a subpackage.
    ({"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/c.py": "from .. import a\n",
      "pkg/a.py": "from pkg import b\n", "pkg/b.py": "from pkg.sub import c\n"},
     [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]),
])
def test_the_rule_finds_exactly_the_real_cycles(tmp_path, files, expected):
    assert cycles(import_graph(write(tmp_path, files))) == expected


# The layers, top down: the decode core runs rounds with the control's choices, the drafters'
# proposals and the runtime's passes, and writes the records. None of them imports one above it.
LAYERS = {
    "specdec.decode": {"engine", "batch", "verify"},
    "specdec.control": {"policy", "theory", "analysis", "cost_model"},
    "specdec.records": {"stats", "trace"},
}
NEVER = [
    ("specdec.control", "specdec.decode"),
    ("specdec.records", "specdec.decode"), ("specdec.records", "specdec.control"),
    ("specdec.drafters", "specdec.decode"), ("specdec.drafters", "specdec.control"),
    *(("specdec.runtime", part) for part in ("specdec.decode", "specdec.control", "specdec.records", "specdec.drafters")),
]


def inside(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def broken_nevers(graph: dict[str, set[str]], nevers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every import (module -> module) from the first part of a pair into its second."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  for low, high in nevers if inside(a, low) and inside(b, high))


def test_the_decode_core_the_control_and_the_records_each_have_a_folder():
    modules = module_names(PACKAGE)
    for folder, names in LAYERS.items():
        assert {f"{folder}.{name}" for name in names} <= modules.keys(), folder
        assert not {f"specdec.{name}" for name in names} & modules.keys()  # not also at the top


def test_imports_run_down_the_layers():
    found = broken_nevers(import_graph(PACKAGE), NEVER)
    assert not found, "imports against the layers:\n" + "\n".join(f"{a} -> {b}" for a, b in found)


def test_the_layer_rule_finds_an_import_upwards(tmp_path):
    """The control: a control module importing the decode core is found, inside a function too."""
    root = write(tmp_path, {"pkg/__init__.py": "", "pkg/decode/__init__.py": "", "pkg/control/__init__.py": "",
                            "pkg/decode/engine.py": "from pkg.control import policy\n",
                            "pkg/control/policy.py": "def f():\n    from pkg.decode.engine import Engine\n"})
    assert broken_nevers(import_graph(root), [("pkg.control", "pkg.decode")]) == [("pkg.control.policy", "pkg.decode.engine")]
