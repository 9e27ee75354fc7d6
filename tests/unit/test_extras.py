"""Each optional extra brings, alone, what its framework needs on the path terngrad takes
through it: ``pip install terngrad[transformers]`` must run ``Trainer(...)``, which needs what
transformers itself puts in its own ``torch`` extra (accelerate, a recent torch), not in its
core requirements. The frameworks' declarations are read from their installed metadata, ours
from pyproject.toml; the pins of constraints.txt (``make test``, CI) must satisfy both."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]

#: our extra -> (the framework it serves, the framework's own extras that terngrad's path needs)
PATHS = {
    "transformers": ("transformers", ("torch",)),  # Trainer: torch and accelerate
    "lightning": ("lightning", ()),
    "accelerate": ("accelerate", ()),
    "tensorboard": ("tensorboard", ()),  # torch.utils.tensorboard's SummaryWriter
}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _by_name(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _needed(framework: str, extras: tuple[str, ...]) -> list[Requirement]:
    """What ``framework`` declares for its optional ``extras`` (its core requirements are
    installed with it anyway)."""
    needed = []
    for req in map(Requirement, metadata.requires(framework) or []):
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            continue  # a core requirement (or one this platform does not take)
        if any(req.marker.evaluate({"extra": e}) for e in extras):
            needed.append(req)
    return needed


def _floor(req: Requirement) -> Version | None:
    """The lowest version ``req`` allows by a ``>=`` clause, ``None`` without one."""
    floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return max(floors, default=None)


@pytest.mark.parametrize("extra", sorted(PATHS))
def test_each_extra_brings_what_its_framework_needs(extra):
    framework, extras = PATHS[extra]
    project = _project()
    ours = _by_name(project["optional-dependencies"][extra])
    core = _by_name(project["dependencies"])
    assert canonicalize_name(framework) in ours, f"terngrad[{extra}] must bring {framework}"
    source = f"{framework}[{','.join(extras)}]"
    for theirs in _needed(framework, extras):
        name = canonicalize_name(theirs.name)
        needed = f"{theirs.name}{theirs.specifier}"
        req = ours.get(name) or core.get(name)
        assert req is not None, f"terngrad[{extra}] lacks {needed} (declared by {source})"
        floor = _floor(req)  # the oldest version our extra lets in must be one they accept
        assert floor is not None and theirs.specifier.contains(floor), (
            f"terngrad[{extra}] allows {req}, but {source} needs {needed}"
        )


def test_the_pins_satisfy_every_extra():
    project = _project()
    pins = _pins()
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    for group, requirements in groups.items():
        for req in map(Requirement, requirements):
            if req.marker is not None and not req.marker.evaluate():
                continue
            pin = pins.get(canonicalize_name(req.name))
            assert pin is not None, f"constraints.txt pins no {req.name} ({group})"
            assert req.specifier.contains(pin), f"constraints.txt's {pin} breaks {req} ({group})"
