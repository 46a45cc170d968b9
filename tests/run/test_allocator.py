"""run/allocator.py: the environment that preloads tcmalloc, and when nothing is to change."""

from __future__ import annotations

import pytest

from tokenrl.run import allocator


@pytest.fixture
def installed(monkeypatch, tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    monkeypatch.setattr(allocator, "TCMALLOC", str(library))
    return str(library)


def test_tcmalloc_goes_first_in_ld_preload(installed):
    assert allocator.with_tcmalloc({"PATH": "/bin"}) == {"PATH": "/bin", "LD_PRELOAD": installed}
    assert allocator.with_tcmalloc({"LD_PRELOAD": "/lib/other.so"})["LD_PRELOAD"] == f"{installed} /lib/other.so"


@pytest.mark.parametrize("environ", [{"LD_PRELOAD": "/x/libtcmalloc.so"}, {"TOKENRL_MALLOC": "system"}])
def test_nothing_changes_when_preloaded_or_turned_off(installed, environ):
    assert allocator.with_tcmalloc(environ) is None


def test_nothing_changes_without_the_library(monkeypatch, tmp_path):
    monkeypatch.setattr(allocator, "TCMALLOC", str(tmp_path / "missing.so"))
    assert allocator.with_tcmalloc({}) is None
