"""Resharding measured between two sub-meshes: each method delivers what the destination's
layout says (the ranks check it, and fail the run otherwise), and bad options are refused
before any process starts."""

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.data.resharding import MeshLayout
from ddlsim.profiler.resharding import measure_resharding


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (MeshLayout(2, "shard"), MeshLayout(2, "replicate")),
        (MeshLayout(1, "replicate"), MeshLayout(2, "shard")),
        (MeshLayout(2, "shard"), MeshLayout(1, "replicate")),
    ],
)
def test_every_method_delivers_and_is_timed(src: MeshLayout, dst: MeshLayout) -> None:
    lines: list[str] = []
    got = measure_resharding(
        src, dst, [4096, 65536], bandwidth="1gbit", warmup=0, repeats=2, progress=lines.append
    )
    samples = got["samples"]
    assert {(s["method"], s["size_bytes"]) for s in samples} == {
        (method, size) for method in ("sendrecv_allgather", "broadcast") for size in (4096, 65536)
    }
    assert all(len(s["times_us"]) == 2 and s["median_ms"] > 0 for s in samples)
    assert got["src"] == {"ranks": src.ranks, "layout": src.layout}
    assert len(lines) == 4  # one line a method and size from rank 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": []}, "sizes must be byte counts from 1 to"),
        ({"sizes": [2 << 30]}, "sizes must be byte counts from 1 to 1073741824 (1 GiB)"),
        ({"sizes": [1024], "methods": ["scatter"]}, "method 'scatter' is not supported"),
        ({"sizes": [1024], "repeats": 0}, "repeats(0) >= 1"),
    ],
)
def test_bad_options_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        measure_resharding(MeshLayout(2, "shard"), MeshLayout(2, "replicate"), **kwargs)
    with pytest.raises(InvalidOptionError, match="at most 16"):
        measure_resharding(MeshLayout(9, "shard"), MeshLayout(9, "replicate"), [1024])
