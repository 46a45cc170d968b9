"""The Hugging Face Hub route: a connect check that makes offline runs fail in seconds, and `datasets` loading
whose failures say what to do (log in for a gated set, or use the local route)."""

from __future__ import annotations

import socket
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HUB_CONNECT_TIMEOUT_S = 3.0


class DataUnavailableError(FileNotFoundError):
    """Neither the Hub nor a local copy can provide a dataset; the message names both routes. A FileNotFoundError, so
    the entry points report it as a user's error (one line, status 2)."""


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hub: repository, split, config(s) (rows concatenated in order), pinned revision
    (None: the branch head), and `columns` renaming Hub columns to the fields the local files use."""

    repo: str
    split: str
    configs: tuple[str | None, ...] = (None,)
    revision: str | None = None
    columns: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def describe(self) -> str:
        configs = ",".join(c for c in self.configs if c) or "default"
        return f"{self.repo} (config {configs}, split {self.split}, revision {self.revision or 'main'})"


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """False in offline mode (HF_HUB_OFFLINE) or when the Hub endpoint (or the https proxy) does not accept a TCP
    connection within HUB_CONNECT_TIMEOUT_S; checked once per process."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    target = urlsplit(urllib.request.getproxies().get("https") or constants.ENDPOINT)
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=HUB_CONNECT_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def load_rows(
    path: str, config: str | None, split: str, revision: str | None = None, cache_dir: str | None = None
) -> list[dict[str, Any]]:
    """Rows of one split through `datasets.load_dataset` (a Hub id, or a local folder laid out as a Hub repository),
    cached as `datasets` caches. Without a reachable Hub, `datasets` goes straight to its cache instead of retrying
    for a minute; DataUnavailableError when that has no copy."""
    import datasets
    from huggingface_hub import constants

    offline = datasets.config.HF_HUB_OFFLINE or constants.is_offline_mode()
    unreachable = not offline and not Path(path).is_dir() and not hub_reachable()
    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = offline or unreachable
    try:
        dataset = datasets.load_dataset(path, config, split=split, revision=revision, cache_dir=cache_dir)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        if unreachable:
            reason = f"the Hub ({constants.ENDPOINT}) does not answer and `datasets` has no cached copy"
        elif offline:
            reason = "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and `datasets` has no cached copy"
        else:
            reason = str(err).splitlines()[0].rstrip(".")
        raise DataUnavailableError(reason + ".") from None
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
    return dataset.to_list()


def load_source(source: HubSource, path: str | None = None, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """The rows of `source` (its configs concatenated), columns renamed to the local fields; `path` replaces the repo
    id (a local folder laid out as the Hub repository)."""
    rows: list[dict[str, Any]] = []
    for config in source.configs:
        try:
            part = load_rows(path or source.repo, config, source.split, source.revision, cache_dir)
        except DataUnavailableError as err:
            if not source.gated:
                raise
            raise DataUnavailableError(
                f"{err} {source.repo} is gated: accept its terms at https://huggingface.co/datasets/{source.repo}, "
                "then `huggingface-cli login` (or set HF_TOKEN)."
            ) from None
        rows.extend({source.columns.get(key, key): value for key, value in row.items()} for row in part)
    return rows
