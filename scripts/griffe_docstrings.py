"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' `extensions`): tokenrl's docstrings are plain
prose that writes placeholders as `<name>` (`configs/selector/<name>.yaml`), which Markdown would read as an HTML
tag and drop. Outside code spans, `<` becomes `&lt;`; the docstrings themselves stay as they are."""

from __future__ import annotations

import re

import griffe

CODE = re.compile(r"(`[^`]*`)")


def escape(text: str) -> str:
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in CODE.split(text))


class EscapePlaceholders(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape(obj.docstring.value)
