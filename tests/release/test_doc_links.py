"""The docs are read on GitHub and in a checkout, where a relative link that points at a moved or deleted
file, or at something beside the repository (a folder that only the author's machine has), is a dead end
for a newcomer. So every relative link in every Markdown file git tracks must name a file or folder of
the repository, and an anchor in a link to a Markdown file must name one of its headings. Links with a
scheme (https:, mailto:) are left alone: they point at public pages this test cannot reach.

The README is the way in: it must link the docs index (docs/README.md) and the troubleshooting page.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import ROOT

#: An inline link or image, ``[text](target)`` or ``[text](target "title")``; the text may hold one level
#: of brackets and span lines. The target is group 1 (angle brackets stripped).
INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
#: A reference definition, ``[label]: target``.
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
#: A plain path that climbs out of its folder, ``../x``, written as prose or code rather than as a link
#: (``.../x`` is an ellipsis, not a path).
CLIMBING_PATH = re.compile(r"(?<![\w./])((?:\.\./)+[\w.-][\w./-]*[\w/])")
#: A Markdown file named in text, ``docs/testing.md`` or ``BUILD-NOTES.md``.
MARKDOWN_PATH = re.compile(r"(?<![\w./-])([\w-][\w./-]*\.md)\b")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


@dataclass(frozen=True)
class Link:
    source: Path  # relative to ROOT
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.target}"


def tracked_markdown() -> list[Path]:
    """Every *.md file git tracks, relative to ROOT (what GitHub shows; build outputs and caches are not)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the Markdown files are the ones git tracks")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return sorted(Path(p) for p in out.split("\0") if p)


def without_fenced_code(text: str) -> str:
    """``text`` with the lines of fenced code blocks blanked (line numbers kept): a ``[x](y)`` there is code."""
    lines = text.split("\n")
    fence: str | None = None
    for i, line in enumerate(lines):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                lines[i] = ""
        else:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            lines[i] = ""
    return "\n".join(lines)


def without_code_spans(text: str) -> str:
    """``text`` with the contents of inline code spans replaced by x's of the same length (offsets kept)."""
    return CODE_SPAN.sub(lambda m: m.group(1) + re.sub(r"[^\n]", "x", m.group(2)) + m.group(1), text)


def links(source: Path) -> list[Link]:
    """The link targets written in ``source``: inline links, images and reference definitions."""
    prose = without_code_spans(without_fenced_code((ROOT / source).read_text(encoding="utf-8")))
    found = [m for pattern in (INLINE_LINK, REFERENCE) for m in pattern.finditer(prose)]
    return [Link(source, prose.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in found]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces turned to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for line in without_fenced_code(markdown.read_text(encoding="utf-8")).split("\n"):
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    result.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", markdown.read_text(encoding="utf-8")))
    return result


def problem(link: Link) -> str | None:
    """Why ``link`` leads nowhere in the repository, or None when it resolves."""
    if not link.target or SCHEME.match(link.target):
        return None
    path, _, anchor = unquote(link.target).partition("#")
    base = ROOT if path.startswith("/") else (ROOT / link.source).parent
    target = (base / path.lstrip("/")).resolve() if path else ROOT / link.source
    if not target.is_relative_to(ROOT):
        return "leaves the repository"
    if not target.exists():
        return "no such file or folder"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{target.relative_to(ROOT)} has no heading with the anchor #{anchor}"
    return None


def test_the_markdown_files_are_found() -> None:
    """A guard for the tests below: they would pass vacuously if the file list came back empty."""
    files = tracked_markdown()
    assert Path("README.md") in files
    assert Path("docs/README.md") in files
    assert sum(len(links(f)) for f in files) > 100


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken = [f"{link}: {why}" for f in tracked_markdown() for link in links(f) if (why := problem(link))]
    assert not broken, "\n".join(broken)


def plain_paths(source: Path) -> list[Link]:
    """Paths written as text rather than as links, outside fenced code: those that climb (``../x``) and
    Markdown files (``BUILD-NOTES.md``, ``docs/testing.md``). URLs are left out."""
    text = URL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_fenced_code((ROOT / source).read_text("utf-8")))
    found = [m for pattern in (CLIMBING_PATH, MARKDOWN_PATH) for m in pattern.finditer(text)]
    return [Link(source, text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in found]


def test_every_plain_path_names_a_file_of_the_repository() -> None:
    """A path written as text (``../shared/DESIGN.md``) is followed by readers as a link is: it must name a
    file or folder of the repository, from the page's folder or from the repository's root."""
    missing = []
    for source in tracked_markdown():
        for path in plain_paths(source):
            candidates = [((ROOT / source).parent / path.target).resolve()]
            if not path.target.startswith("../"):
                candidates.append((ROOT / path.target).resolve())
            if not any(c.is_relative_to(ROOT) and c.exists() for c in candidates):
                missing.append(str(path))
    assert not missing, "\n".join(missing)


def test_the_readme_links_the_docs_index_and_troubleshooting() -> None:
    targets = {link.target.partition("#")[0] for link in links(Path("README.md"))}
    assert {"docs/README.md", "docs/troubleshooting.md"} <= targets, targets


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("docs/operator.md", None),
        ("docs/operator.md#high-availability", None),
        ("docs/", None),
        ("https://kubernetes.io/docs/", None),
        ("#kubedgx", None),
        ("docs/nothing-here.md", "no such file or folder"),
        ("../shared/DESIGN.md", "leaves the repository"),
        ("docs/operator.md#no-such-heading", "docs/operator.md has no heading with the anchor #no-such-heading"),
    ],
)
def test_the_checker_tells_good_links_from_bad(target: str, why: str | None) -> None:
    """The checker itself, on links written in README.md: it must refuse what the docs must not contain."""
    assert problem(Link(Path("README.md"), 1, target)) == why


def test_links_are_read_as_github_renders_them() -> None:
    """Link text may span lines and hold code; links inside code are not links."""
    text = "see [the\n`chart`](charts/kubedgx/README.md) and `[x](gone.md)`\n```\n[y](gone.md)\n```\n"
    prose = without_code_spans(without_fenced_code(text))
    assert [m.group(1) for m in INLINE_LINK.finditer(prose)] == ["charts/kubedgx/README.md"]
    assert slug("The `kubedgx` CLI: flags, exit codes (and more)") == "the-kubedgx-cli-flags-exit-codes-and-more"
