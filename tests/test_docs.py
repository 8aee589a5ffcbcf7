"""The docs and comments point at things that exist: links resolve inside the repository, and
module paths named in comments, docstrings and docs (``core_log/log.py``, ``api.records``) are
real modules. A reader who follows one never lands outside the repository or on nothing."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core_log", "cluster", "api", "spark_sink", "auth_quotas", "openapi", "benchmarks")
TREES = (*PACKAGES, "examples", "tests")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_OUTSIDE = re.compile(r"`(\.\./[^`]+)`")  # a path in backquotes that climbs out of its folder
_TREES = "|".join(TREES)
_PACKAGES = "|".join(PACKAGES)
_SLASHED = re.compile(rf"(?<![\w./-])((?:{_TREES})/[\w/]*\w\.(?:py|c|md|json))")
_DOTTED = re.compile(rf"(?<![\w./-])((?:{_PACKAGES})\.([a-z_][a-z0-9_]*))\b")


def _sources() -> list[Path]:
    mine = Path(__file__).resolve()  # its own examples are dangling on purpose
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py") if p != mine)


def _commentary(path: Path) -> str:
    """Comments and string literals (docstrings among them) of a Python file."""
    parts = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            parts.append(tok.string)
    return "\n".join(parts)


def _module_exists(package: str, name: str) -> bool:
    base = ROOT / package
    if (base / f"{name}.py").exists() or (base / name).is_dir() or (base / f"{name}.c").exists():
        return True
    init = (base / "__init__.py").read_text()  # or a name the package itself defines
    return re.search(rf"^(def|class) {name}\b|^{name}\s*=", init, re.MULTILINE) is not None


def dangling_references(text: str) -> list[str]:
    out = [m[1] for m in _SLASHED.finditer(text) if not (ROOT / m[1]).exists()]
    for m in _DOTTED.finditer(text):
        package, name = m[1].split(".")
        if name not in ("py", "md", "c", "json") and not _module_exists(package, name):
            out.append(m[1])
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        resolved = (doc.parent / target.split("#")[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    for target in _OUTSIDE.findall(text):
        resolved = (doc.parent / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert not broken, f"{doc.name} points at {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_modules_that_exist(doc: Path) -> None:
    assert not dangling_references(doc.read_text())


def test_comments_name_modules_that_exist() -> None:
    found = {
        str(path.relative_to(ROOT)): refs
        for path in _sources()
        if (refs := dangling_references(_commentary(path)))
    }
    assert not found, found


def test_the_checker_catches_what_it_should() -> None:
    assert dangling_references("see core_log/nope.py and api.nope, not core_log/log.py") == [
        "core_log/nope.py",
        "api.nope",
    ]
    assert dangling_references("spark_sink.register(spark) and core_log.limits.MAX_X") == []
