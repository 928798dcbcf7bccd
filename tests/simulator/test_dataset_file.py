"""Reading one part of a dataset file without parsing the rest (the shipped link fits)."""

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.simulator.dataset.json_file import read_part
from ddlsim.simulator.default import shipped_dataset, shipped_link_fits

LINKS = [{"collective": "all_reduce", "world_size": 2, "alpha_us": 12.5}]


def _write(path: Path, document: Any, indent: int | None = None) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(document, f, indent=indent)
    return path


@pytest.mark.parametrize("indent", [None, 2])
def test_a_part_after_a_long_value_is_read_whole(tmp_path: Path, indent: int | None) -> None:
    """A value longer than one read (here 300 000 characters) is read to its end first, and a
    number cut at a read's end is not taken for the whole number."""
    document = {
        "format": 1,
        "meta": {"note": "x" * 300_000, "n": 123456789},
        "links": LINKS,
        "kernels": [{"graph": {}, "node_ms": {"0": 1.5}}] * 1000,
    }
    path = _write(tmp_path / "d.json.gz", document, indent)
    for key, value in document.items():
        assert read_part(path, key) == value


def test_the_shipped_links_lie_in_the_files_first_64_kib(tmp_path: Path) -> None:
    """The shipped dataset keeps its small parts first: the link fits are read from its first
    64 KiB alone (a copy cut there still yields them)."""
    with gzip.open(shipped_dataset(), "rt", encoding="utf-8") as f:
        head = f.read(1 << 16)
    cut = tmp_path / "head.json.gz"
    with gzip.open(cut, "wt", encoding="utf-8") as f:
        f.write(head)
    links = read_part(cut, "links")
    assert links and links == read_part(shipped_dataset(), "links")
    assert read_part(cut, "format") == 1
    assert [fit.collective for fit in shipped_link_fits()] == [e["collective"] for e in links]
    with pytest.raises(InvalidOptionError, match="cannot be read"):
        read_part(cut, "runs")  # cut off: an error, never a part of a part


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": 1, "meta": {}}', "has no 'links'"),
        ("[1, 2]", "cannot be read: not a JSON object"),
        ('{"format": 1, "links": [1, 2', "cannot be read"),
        ('{"format" 1}', "cannot be read: expected ':'"),
    ],
)
def test_a_file_without_the_part_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(InvalidOptionError, match=message):
        read_part(path, "links")
    with pytest.raises(InvalidOptionError, match="cannot be read"):
        read_part(tmp_path / "missing.json.gz", "links")
