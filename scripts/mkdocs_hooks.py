"""MkDocs hooks (mkdocs.yml `hooks:`): the configuration reference is built from the configs, the structure's numbers
on docs/architecture.md are measured (scripts/structure.py), and the committed study reports and benchmark records are
part of the site.

`configuration.md` is generated here from configs/**/*.yaml (scripts/config_reference.py), never committed: a new
config file is on the site's reference without a step of its own.

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
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import scripts.config_reference as config_reference  # noqa: E402  (the repository on the path)
import scripts.structure as structure  # noqa: E402

SERVED = ("reports", "benchmarks")  # repository folders served in the site under their own paths
INPUTS = {"reading.md"}  # a report's reading is an input of scripts/report.py, inside report.md
LINK = re.compile(r"(\]\()(?P<target>[^)\s]+)(\))")


def served(path: Path) -> bool:
    return path.is_file() and path.name not in INPUTS


def on_files(files: Files, config) -> Files:
    reference = config_reference.OUT.relative_to(ROOT / "docs").as_posix()
    if files.get_file_from_path(reference) is not None:  # a local copy the script wrote: the configs' page wins
        files.remove(files.get_file_from_path(reference))
    files.append(File.generated(config, reference, content=config_reference.render(config_reference.files())))
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
    here = os.path.dirname(page.file.abs_src_path or os.path.join(config.docs_dir, page.file.src_uri))
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

    if structure.MARKER in markdown:  # docs/architecture.md: the structure's numbers, measured now
        markdown = markdown.replace(structure.MARKER, structure.markdown())
    return LINK.sub(rewrite, markdown)
