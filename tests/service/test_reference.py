"""The manual's reference pages are what the code makes now."""

from pathlib import Path

from ddlsim.service.reference import PAGES, cli_markdown, specs_markdown, stale

ROOT = Path(__file__).resolve().parents[2]


def test_reference_pages_are_not_stale() -> None:
    assert stale(ROOT) == [], "run: .venv/bin/python scripts/reference.py"


def test_pages_cover_every_command_and_strategy_field() -> None:
    cli = cli_markdown()
    for command in (
        "ddlsim predict",
        "ddlsim search",
        "ddlsim run",
        "ddlsim serve",
        "ddlsim profile batch",
        "ddlsim simulator dataset export",
    ):
        assert f"`{command}`" in cli, command
    assert "`--device`" in cli and "`--verify`" in cli
    specs = specs_markdown()
    for field in ("`bucket_cap_mb`", "`dear`", "`micro_batches`", "`pp_schedule`", "`precision`"):
        assert field in specs, field
    assert set(PAGES) == {
        "docs/reference/cli.md",
        "docs/reference/rest.md",
        "docs/reference/specs.md",
    }
