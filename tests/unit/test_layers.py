"""The layering: the quantizer layer imports nothing above it, no module imports a layer above
its own (docs/architecture.md), and no import runs in a cycle, annotation-only ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import terngrad

PACKAGE = Path(terngrad.__file__).parent


#: the layers, bottom to top (docs/architecture.md): a module imports its own layer and below
LAYERS = [
    "util",
    "wire",
    "quantize",
    "kernels",
    "comm",
    "ddp",
    "train",
    "bench",
    "experiments",
    "cli",
]


LAYER_OF = {
    **{name: i for i, name in enumerate(LAYERS)},
    "integrations": LAYERS.index("ddp"),
    "optim": LAYERS.index("ddp"),
    "fsdp": LAYERS.index("ddp"),
    "diloco": LAYERS.index("ddp"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every terngrad module ``path`` imports, at any depth (functions
    and ``TYPE_CHECKING`` blocks included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "terngrad":  # from terngrad import quantize, wire
                found += [(node.lineno, f"terngrad.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] == "terngrad"]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] == "__init__":
        return None  # the package itself
    return LAYER_OF.get(parts[1])


def _module_level_imports(path: Path) -> list[str]:
    """The terngrad modules ``path`` imports at its top level: its top-level statements and
    ``if``/``try`` blocks, ``if TYPE_CHECKING:`` blocks included (an import for annotations
    only ties the modules as much as any); function bodies left out (a lazy import runs when
    the function is called, not when the module is imported)."""

    def walk(body):
        for node in body:
            if isinstance(node, ast.If):
                yield from walk(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                yield from walk(node.body + node.orelse + node.finalbody)
            elif isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:  # a submodule if there is one, else the package
                    sub = f"{node.module}.{alias.name}"
                    yield sub if _path(sub) is not None else node.module

    tree = ast.parse(path.read_text(), str(path))
    return [name for name in walk(tree.body) if name.split(".")[0] == "terngrad"]


def _path(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_quantizer_layer_imports_nothing_above_it():
    files = sorted((PACKAGE / "quantize").glob("*.py"))
    assert {"kernels.py", "reference.py", "base.py"} <= {f.name for f in files}
    upward = [
        f"{f.name}:{line} imports {name}"
        for f in files
        for line, name in _imports(f)
        if name.split(".")[1] not in ("quantize", "wire", "util")
    ]
    assert upward == []


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("terngrad", *path.relative_to(PACKAGE).with_suffix("").parts))
        own = _layer(module)
        if own is None:
            continue
        for line, name in _imports(path):
            layer = _layer(name)
            if layer is not None and layer > own:
                upward.append(f"{module}:{line} imports {name}")
    assert upward == []


def test_the_scan_sees_an_upward_import(tmp_path):
    """The scan itself: a module of the quantizer layer importing the kernels is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from terngrad.kernels import NumbaKernels\n")
    assert _imports(bad) == [(2, "terngrad.kernels")]
    assert _layer("terngrad.kernels.fused_cpu") > _layer("terngrad.quantize.base")


def test_the_cycle_scan_sees_annotation_imports(tmp_path):
    """The cycle scan reads ``TYPE_CHECKING`` blocks and leaves function bodies out."""
    module = tmp_path / "annotated.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from terngrad.quantize.base import Quantizer\n"
        "def f():\n"
        "    from terngrad.kernels import NumbaKernels\n"
    )
    assert _module_level_imports(module) == ["terngrad.quantize.base"]


def test_no_import_cycles():
    """No cycle among the modules' top-level imports, annotation-only (``TYPE_CHECKING``) ones
    included; lazy imports inside functions are left out (:func:`_module_level_imports`)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported = [m for m in _module_level_imports(path) if _path(m) is not None]
        graph[module] = list(dict.fromkeys(imported))  # each once: one report per cycle
    cycles, state = [], {}

    def visit(module, stack):
        state[module] = "open"
        for target in graph.get(module, ()):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


#: the rooms of ``terngrad/comm/``, in the order they may import each other (docs/architecture.md)
COMM_ROOMS = ["exchanges", "spec", "rank", "front"]


def test_the_rooms_of_comm_import_only_the_rooms_before_them():
    """``exchanges`` < ``spec`` < ``rank`` < ``front``: a room imports (at any depth, lazy
    imports included) none after it; ``comm/errors.py`` stands beside them all."""
    backward = []
    for own, room in enumerate(COMM_ROOMS):
        for path in sorted((PACKAGE / "comm" / room).rglob("*.py")):
            for line, name in _imports(path):
                parts = name.split(".")
                room = parts[2] if parts[:2] == ["terngrad", "comm"] and len(parts) > 2 else None
                if room in COMM_ROOMS and COMM_ROOMS.index(room) > own:
                    backward.append(f"{path.relative_to(PACKAGE)}:{line} imports {name}")
    assert backward == []
    assert sorted(
        p.name for p in (PACKAGE / "comm").iterdir() if p.is_dir() and p.name[0] != "_"
    ) == sorted(COMM_ROOMS)
