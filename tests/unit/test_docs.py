"""The documentation keeps up with the code.

* **Every module is named in docs/architecture.md**, by this rule: a module
  ``terngrad/<folder>/<name>.py`` is named as the code span `` `<name>.py` `` in the section
  whose heading names its folder as `` `terngrad/<folder>/` `` (a section runs from its heading
  to the next heading of any level; modules directly under ``terngrad/`` belong to the section
  headed `` `terngrad/` ``). ``__init__.py`` and ``__main__.py`` are left out. A new module
  needs a line in its folder's table; a new folder, a section of its own.
* The README stays short: at most 150 lines; the rest lives in docs/.
* Every relative link of README.md and docs/*.md points to a file or folder that exists
  (relative to the page; anchors are not checked).
* Every ``terngrad.<...>`` name in the README's Python blocks resolves after a plain
  ``import terngrad`` (a block pasted as it is runs).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "terngrad"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: a heading that names a package folder: `terngrad/` or `terngrad/comm/` or `terngrad/a/b/`
FOLDER_HEADING = re.compile(r"`terngrad/((?:\w+/)*)`")
#: an inline link or image: [text](target) or [text](target "title")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCED_BLOCK = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _modules() -> list[Path]:
    """Every module of the package, relative to ``terngrad/``, but for the packages' own."""
    return sorted(
        path.relative_to(PACKAGE)
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )


def _sections_by_folder(text: str) -> dict[str, str]:
    """The text of each section of ``text`` whose heading names a package folder, by that
    folder relative to ``terngrad/`` (``""`` for the package itself)."""
    sections: dict[str, list[str]] = {}
    folder = None
    for line in text.splitlines():
        if line.startswith("#"):
            named = FOLDER_HEADING.search(line)
            folder = named.group(1).rstrip("/") if named else None
            if folder is not None:
                sections.setdefault(folder, [])
        elif folder is not None:
            sections[folder].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def test_architecture_names_every_module_in_its_folders_section():
    sections = _sections_by_folder(ARCHITECTURE.read_text())
    missing = []
    for module in _modules():
        folder = "" if module.parent == Path(".") else module.parent.as_posix()
        if f"`{module.name}`" not in sections.get(folder, ""):
            missing.append(f"terngrad/{module.as_posix()}")
    assert not missing, (
        f"docs/architecture.md does not name {', '.join(missing)}: add `name.py` to the section "
        "headed `terngrad/<folder>/` of each"
    )


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move details into docs/"


def _relative_links(page: Path) -> list[str]:
    """The targets of ``page``'s links that are paths in this repository (no scheme, not an
    anchor of the page itself), outside code blocks and code spans."""
    text = CODE_SPAN.sub("code", FENCED_BLOCK.sub("", page.read_text()))
    targets = [match.group(1) for match in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_every_relative_link_points_to_a_file_that_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in _relative_links(page)
        if not (page.parent / target.split("#")[0]).exists()
    ]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_terngrad_name_in_the_readmes_python_resolves_after_import_terngrad():
    """``terngrad.diloco.DiLoCo`` pasted after ``import terngrad`` raised AttributeError (a
    submodule not imported by the package): each name is looked up attribute by attribute
    in a fresh interpreter, which has imported nothing else."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    names = sorted({m for b in blocks for m in re.findall(r"\bterngrad(?:\.\w+)+", b)})
    assert "terngrad.diloco.DiLoCo" in names and len(names) >= 8, names
    script = (
        "import functools, sys, terngrad\n"
        "for name in sys.argv[1:]:\n"
        "    functools.reduce(getattr, name.split('.')[1:], terngrad)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, *names], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
