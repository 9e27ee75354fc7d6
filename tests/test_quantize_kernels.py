"""``kernels=`` on the public API: every backend gives the reference's frames and values for
every quantizer, and the quantizer layer, which defines the interface and the reference
backend, imports nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import terngrad
from terngrad import quantize
from terngrad.kernels import numba_available

PACKAGE = Path(terngrad.__file__).parent
#: the layers, bottom to top (docs/architecture.md): a module imports its own layer and below
LAYERS = ["util", "wire", "quantize", "kernels", "comm", "ddp", "train", "bench", "cli"]
LAYER_OF = {**{name: i for i, name in enumerate(LAYERS)}, "integrations": LAYERS.index("ddp")}


def _quantizers() -> list[tuple[str, dict]]:
    """Every registered method with its defaults, and with buckets of 512 where it takes them."""
    cases = []
    for name in quantize.names():
        cases.append((name, {}))
        if "bucket_size" in quantize.get(name).option_names():
            cases.append((name, {"bucket_size": 512}))
    return cases


def _gradient(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 3
    g[: min(n, 7)] = 0.0  # a run of zeros
    return g.to(dtype)


INPUTS = {
    "one": dict(n=1),
    "plain": dict(n=5_003),
    "segments": dict(n=3_300, segments=(1_000, 0, 2_000, 7, 293)),
    "float16": dict(n=4_099, dtype=torch.float16),
    "uniform": dict(n=2_048, uniform=True),
}


@pytest.mark.skipif(not numba_available(), reason="numba is not installed")
@pytest.mark.parametrize("case", list(INPUTS))
@pytest.mark.parametrize(("name", "options"), _quantizers(), ids=str)
def test_default_and_reference_give_the_same_frames_and_values(name, options, case):
    spec = INPUTS[case]
    q = quantize.get(name, **options)
    g = _gradient(spec["n"], seed=spec["n"], dtype=spec.get("dtype", torch.float32))
    uniform = torch.rand(g.numel(), generator=torch.Generator().manual_seed(9))

    def encode(kernels):
        return q.encode(
            g,
            torch.Generator().manual_seed(3),
            segments=spec.get("segments"),
            uniform=uniform if spec.get("uniform") else None,
            kernels=kernels,
        )

    fused, ref = encode(None), encode("torch")
    assert torch.equal(fused.to_frame(), ref.to_frame())
    assert fused.shape == tuple(g.shape) and fused.dtype == g.dtype
    expected = q.decode(ref, kernels="torch")
    for kernels in (None, "auto", "numba", "torch"):  # any backend decodes any frame
        assert torch.equal(q.decode(fused, kernels=kernels), expected)
        assert torch.equal(quantize.decode(ref.to_frame(), kernels=kernels), expected)
        out = torch.full(g.shape, 7.0)
        assert q.decode(fused, out=out, kernels=kernels) is out
        assert torch.equal(out, expected)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("name", quantize.names())
def test_empty_gradients_need_no_kernel(name, kernels):
    q = quantize.get(name)
    enc = q.encode(torch.empty(0, 3), kernels=kernels)
    assert q.decode(enc, kernels=kernels).shape == (0, 3)
    with pytest.raises(ValueError, match="kernels must be one of"):
        q.encode(torch.empty(0), kernels="fast")  # checked even where nothing runs


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("name", quantize.names())
def test_non_finite_gradients_keep_the_reference_message(name, kernels):
    q = quantize.get(name)
    g = torch.randn(3_000)
    g[[0, 1_500]] = torch.tensor([float("nan"), float("-inf")])
    with pytest.raises(ValueError, match=r"gradient has 2 non-finite value\(s\) \(NaN or Inf\)"):
        q.encode(g, kernels=kernels)
    with pytest.raises(ValueError, match=r"gradient has 2 non-finite value\(s\)"):
        q.variance(g, kernels=kernels)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_a_two_bit_ternary_message_with_a_digit_3_is_refused(kernels):
    q = quantize.get("terngrad", packing="2bit")
    enc = q.encode(torch.randn(1_000), kernels=kernels)
    assert q.decode(enc, kernels=kernels).shape == (1_000,)
    enc.payload[10] = 0b11_00_00_00  # one field of 3: a digit the message's 3 levels lack
    with pytest.raises(ValueError, match="has a digit 3 beyond its 3 levels"):
        q.decode(enc, kernels=kernels)


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


def _module_level_imports(path: Path) -> list[str]:
    """The terngrad modules ``path`` imports when it is imported: its top-level statements,
    ``if``/``try`` blocks included, ``TYPE_CHECKING`` blocks and function bodies left out."""

    def walk(body):
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
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


def test_no_import_cycles():
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = [m for m in _module_level_imports(path) if _path(m) is not None]
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
