"""The project's documents stand on their own: no tracked file links or refers to a path
outside the repository, design citations name docs/design.md (not an outside note), and
every "docs/design.md section N" (or "sections N and M", "section 4, constraint K") names
a section, or a constraint, that docs/design.md has."""
from __future__ import annotations

import pytest
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SHARED = "sha" + "red"  # spelled apart so this file does not match its own patterns
# the outside notes: by a parent-relative path, or by their folder and file name
OUTSIDE = [
    re.compile(r"\.\./+" + SHARED + r"\b"),
    re.compile(r"(?<![\w/.-])" + SHARED + r"/[A-Z][A-Z_]*\.md"),
]
OLD_CITATION = re.compile(r"\bDESIGN\b(?:\s+(?:section|sections|constraint)\b|\s+\d|\]\()")
CITATION = re.compile(r"docs/design\.md,?\s+sections?\s+(\d+)((?:\s*(?:,|and)\s*\d+)*)"
                      r"(?:,\s*constraint\s+(\d+))?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_text_files() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    out = {}
    for name in filter(None, names):
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (images)
        out[name] = data.decode("utf-8", errors="replace")
    return out


def design_sections() -> dict[int, str]:
    text = DESIGN.read_text()
    heads = list(re.finditer(r"^## (\d+)\. .*$", text, re.M))
    return {int(m.group(1)): text[m.end():(heads[i + 1].start() if i + 1 < len(heads)
                                            else len(text))]
            for i, m in enumerate(heads)}


@pytest.mark.procs
def test_no_file_refers_to_a_path_outside_the_repository():
    bad = []
    for name, text in tracked_text_files().items():
        for pat in OUTSIDE:
            for m in pat.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{name}:{line}: {m.group(0)}")
        if name.endswith(".md"):
            for m in MD_LINK.finditer(text):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"[a-z]+:", target):  # anchors, URLs
                    continue
                where = (ROOT / name).parent / target
                if not where.resolve().is_relative_to(ROOT):
                    line = text.count("\n", 0, m.start()) + 1
                    bad.append(f"{name}:{line}: link to {target} leaves the repository")
    assert not bad, "\n".join(bad)


@pytest.mark.procs
def test_design_citations_name_sections_that_exist():
    sections = design_sections()
    assert sorted(sections) == list(range(1, len(sections) + 1)), "sections numbered 1..n"
    constraints = {int(n) for n in re.findall(r"^(\d+)\. ", sections[4], re.M)}
    assert constraints == set(range(1, 8)), constraints
    bad, seen = [], 0
    for name, text in tracked_text_files().items():
        for m in OLD_CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{name}:{line}: cites DESIGN, not docs/design.md: {m.group(0)!r}")
        for m in CITATION.finditer(text):
            seen += 1
            line = text.count("\n", 0, m.start()) + 1
            nums = [int(m.group(1))] + [int(n) for n in re.findall(r"\d+", m.group(2) or "")]
            for n in nums:
                if n not in sections:
                    bad.append(f"{name}:{line}: docs/design.md has no section {n}")
            if m.group(3) and (nums != [4] or int(m.group(3)) not in constraints):
                bad.append(f"{name}:{line}: no constraint {m.group(3)} in section {nums}")
    assert not bad, "\n".join(bad)
    assert seen >= 20  # the sources do cite it (the check above is not vacuous)


def test_the_design_doc_has_what_the_sources_rely_on():
    s = {n: " ".join(text.split()) for n, text in design_sections().items()}
    assert "a worker's death is a failure event as soon as it is known" in s[6].lower()
    assert "--rejoin" in s[6] and "R:S@ITER" in s[6]
    assert '"format": "recycle.plan/v1"' in s[5]
    assert "may import" in s[3]
