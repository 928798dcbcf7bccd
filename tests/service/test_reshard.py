"""``ddlsim profile reshard``: both methods measured between two sub-meshes, each priced from the
store's fits; a mesh, size or missing fit is refused in one line before any process starts."""

import json

import pytest

from ddlsim.data.store import Store, add_collective_profile
from ddlsim.service.cli import main
from tests.data.records import collective_profile


def _store_fits() -> None:
    with Store.open() as store, store.transaction() as session:
        for name, ranks in (("sendrecv", 3), ("all_gather", 2)):
            fit = collective_profile(
                collective=name, world_size=ranks, alpha_us=500.0, busbw_gbps=0.9
            )
            add_collective_profile(session, profile=fit)


def test_both_methods_are_measured_and_priced(capsys: pytest.CaptureFixture[str]) -> None:
    _store_fits()
    args = ["profile", "reshard", "--src", "1:replicate", "--dst", "2:replicate"]
    assert main([*args, "--sizes", "64KiB,1MiB", "--repeats", "2", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert {(r["method"], r["size_bytes"]) for r in rows} == {
        (m, s) for m in ("sendrecv_allgather", "broadcast") for s in (65536, 1 << 20)
    }
    for row in rows:
        assert row["measured_ms"] > 0 and row["predicted_ms"] > 0
        assert row["error"] == pytest.approx(row["predicted_ms"] / row["measured_ms"] - 1)

    # From one rank: broadcast sends the whole MiB to each of the two; send/recv sends each its
    # half, then the two all-gather (the fits: 500 us + bytes at 0.9 Gbit/s, the all-gather's
    # factor (n - 1) / n).
    def us(nbytes: float) -> float:
        return 500.0 + nbytes / (0.9 * 125.0)

    big = {r["method"]: r["predicted_ms"] for r in rows if r["size_bytes"] == 1 << 20}
    assert big["broadcast"] == pytest.approx(2 * us(1 << 20) / 1e3)
    assert big["sendrecv_allgather"] == pytest.approx((2 * us(1 << 19) + us(1 << 19)) / 1e3)


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        ("2:rows", "mesh layout 'rows' is not supported; allowed: shard, replicate"),
        ("two:shard", "mesh 'two:shard' is not RANKS:LAYOUT"),
    ],
)
def test_bad_meshes_are_one_line(
    capsys: pytest.CaptureFixture[str], mesh: str, message: str
) -> None:
    assert main(["profile", "reshard", "--src", mesh, "--dst", "2:shard"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_missing_fit_names_the_command_that_measures_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["profile", "reshard", "--src", "2:shard", "--dst", "2:replicate"]) == 2
    err = capsys.readouterr().err
    assert "no sendrecv fit over 4 ranks at 1gbit" in err
    assert "ddlsim profile collectives --world-size 4 --bandwidth 1gbit" in err
