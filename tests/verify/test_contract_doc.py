"""The contract a runtime is held to ships with the package, and the READMEs point at it: no
user is sent to a design file outside the repository (issue 38, "The contract, shipped")."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
# Each README and how it writes the link to the contract.
READMES = {"README.md": "spyre_verify/CONTRACT.md", "reports/README.md": "../spyre_verify/CONTRACT.md"}


def contract() -> str:
    return (importlib.resources.files("spyre_verify") / "CONTRACT.md").read_text(encoding="utf-8")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered from -1."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen[f"{slug}-{n}"] = 1
    return set(seen)


def test_the_contract_ships_in_the_package() -> None:
    text = contract()
    for section in ("Glossary", "Configuration", "Ladders", "The padded layout", "The ragged layout", "Reachability"):
        assert f"\n## {section}\n" in text, section
    assert "\n## Oracles: who may judge what\n" in text
    inside = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert not sorted(inside - anchors(text)), "the contract links sections of its own it lacks"
    # An editable install reads the source tree; a wheel carries only declared package data.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "CONTRACT.md" in setuptools["package-data"]["spyre_verify"]


@pytest.mark.parametrize("readme", sorted(READMES))
def test_readmes_link_the_contract_with_anchors_it_has(readme: str) -> None:
    text = (ROOT / readme).read_text(encoding="utf-8")
    link = READMES[readme]
    assert f"]({link})" in text or f"]({link}#" in text
    have = anchors(contract())
    used = re.findall(rf"\]\({re.escape(link)}#([^)]+)\)", text)
    assert used, f"{readme} links no section of the contract"
    assert not sorted(set(used) - have), f"{readme} links sections the contract lacks"


@pytest.mark.parametrize("readme", [*sorted(READMES), "spyre_verify/CONTRACT.md"])
def test_no_user_is_sent_to_a_design_file_outside_the_repository(readme: str) -> None:
    text = (ROOT / readme).read_text(encoding="utf-8")
    found = [line for line in text.splitlines() if re.search(r"\bDESIGN\b", line)]
    assert not found, f"{readme} still names DESIGN, which users cannot read: {found[:3]}"
