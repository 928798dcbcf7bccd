"""What a prediction stands on: a link the store has no fit of is profiled only where asked,
and only the collectives the store lacks; the shipped dataset's fits stand in until then."""

from typing import Any

import pytest

from ddlsim.cluster.launcher import SlurmLauncher
from ddlsim.cluster.slurm import SlurmSettings
from ddlsim.data.errors import DdlsimError
from ddlsim.data.store import Store
from ddlsim.data.zoo import ZOO
from ddlsim.profiler.collectives import CollectiveProfile
from ddlsim.workflows import profiles, search
from ddlsim.workflows.requests import SearchRequest
from tests.data.records import collective_profile


def test_only_the_collectives_the_store_lacks_are_profiled(
    monkeypatch: pytest.MonkeyPatch, private_store: str
) -> None:
    asked: list[dict[str, Any]] = []

    def fake_profile(**kwargs: Any) -> CollectiveProfile:
        asked.append(kwargs)
        raise _StopError

    monkeypatch.setattr(profiles, "profile_collectives", fake_profile)
    with Store.open() as store:
        store.save_collective_profile(profile=collective_profile(world_size=2))
        with pytest.raises(_StopError):
            profiles.profile_link(
                store, world_size=2, bandwidth="1gbit", collectives=("all_reduce", "sendrecv")
            )
        assert asked[0]["collectives"] == ["sendrecv"]
        assert asked[0]["world_size"] == 2 and asked[0]["bandwidth"] == "1gbit"
        assert asked[0]["sizes"] == profiles.SEARCH_LINK_SIZES
        # everything there already: nothing runs
        assert not profiles.profile_link(
            store, world_size=2, bandwidth="1gbit", collectives=("all_reduce",)
        )
        assert len(asked) == 1


def test_the_shipped_fits_stand_in_for_a_link_the_store_lacks(private_store: str) -> None:
    with Store.open() as store:
        fits = profiles.link_fits(store)
        assert {(f.world_size, f.bandwidth) for f in fits} >= {(2, "1gbit"), (4, "1gbit")}
        assert all(f.backend == "gloo" for f in fits)
        stored = collective_profile(world_size=4)
        store.save_collective_profile(profile=stored)
        four = [
            f for f in profiles.link_fits(store) if (f.world_size, f.bandwidth) == (4, "1gbit")
        ]
        assert [(f.collective, f.alpha_us) for f in four] == [("all_reduce", stored.alpha_us)]


def test_a_verifying_search_profiles_this_machines_link_first(
    monkeypatch: pytest.MonkeyPatch, private_store: str
) -> None:
    asked: list[dict[str, Any]] = []

    def fake_profile_link(store: Store, **kwargs: Any) -> bool:
        asked.append(kwargs)
        raise _StopError

    monkeypatch.setattr(search, "profile_link", fake_profile_link)
    request = SearchRequest(model=ZOO["mlp"], world_size=2, bandwidth="1gbit", verify=True)
    with Store.open() as store:
        with pytest.raises(_StopError):
            search.search(request, store)
        assert asked[0]["world_size"] == 2 and asked[0]["bandwidth"] == "1gbit"
        assert set(asked[0]["collectives"]) == {
            *profiles.LINK_COLLECTIVES,
            *profiles.PLAN_COLLECTIVES,
            *profiles.RING_COLLECTIVES,
        }
        # without --verify, or with the runs on another cluster, it is not profiled
        asked.clear()
        monkeypatch.setattr(search, "build_evaluator", _stop_building)
        for quiet in (SearchRequest(model=ZOO["mlp"], world_size=2, bandwidth="1gbit"),):
            with pytest.raises(_StopError):
                search.search(quiet, store)
        with pytest.raises(_StopError):
            search.search(request, store, launcher=SlurmLauncher(SlurmSettings(gpus_per_node=2)))
        assert asked == []


class _StopError(DdlsimError):
    """Ends the workflow where the test has seen what it wanted."""


def _stop_building(*args: Any) -> Any:
    raise _StopError
