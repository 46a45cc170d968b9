"""MkDocs hooks (mkdocs.yml `hooks:`): the committed study reports and benchmark records are part of the site.

The pages under docs/ link to them as files of the repository (`../reports/cpu_study/report.md`), which is what works
when the Markdown is read on a forge or in an editor. The site serves `reports/` and `benchmarks/` under the same
paths (`reports/cpu_study/report/`), and a link whose file is one of them is rewritten to its place in the site before
MkDocs validates it. Every other link is left as written, so `mkdocs build --strict` still fails on a link to a file
that is neither a page nor one of these files (`../src/...`, `../configs/...`, `../README.md`, a typo).
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
SERVED = ("reports", "benchmarks")  # repository folders served in the site under their own paths
INPUTS = {"reading.md"}  # a report's reading is an input of scripts/report.py, inside report.md
LINK = re.compile(r"(\]\()(?P<target>[^)\s]+)(\))")


def served(path: Path) -> bool:
    return path.is_file() and path.name not in INPUTS


def on_files(files: Files, config) -> Files:
    for folder in SERVED:
        for path in sorted((ROOT / folder).rglob("*")):
            if served(path):
                files.append(
                    File(
                        path.relative_to(ROOT).as_posix(),
                        src_dir=str(ROOT),
                        dest_dir=config.site_dir,
                        use_directory_urls=config.use_directory_urls,
                    )
                )
    return files


def site_path(path: str, docs_dir: str) -> str | None:
    """The site's name for a file of the repository: relative to docs/ for a page, the repository path for a file
    of a served folder; None for anything else."""
    docs = os.path.normpath(docs_dir)
    if path == docs or path.startswith(docs + os.sep):
        return Path(path).relative_to(docs).as_posix()
    relative = Path(path).relative_to(ROOT).as_posix() if path.startswith(str(ROOT) + os.sep) else None
    if relative and relative.split("/", 1)[0] in SERVED and served(ROOT / relative):
        return relative
    return None


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    here = os.path.dirname(page.file.abs_src_path)
    site_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:|^[#/]", target):  # a URL, an anchor or an absolute path
            return match[0]
        path, _, anchor = target.partition("#")
        name = site_path(os.path.normpath(os.path.join(here, path)), config.docs_dir)
        if name is None:
            return match[0]
        relative = posixpath.relpath(name, site_dir or ".")
        return f"{match[1]}{relative}{'#' + anchor if anchor else ''}{match[3]}"

    return LINK.sub(rewrite, markdown)
