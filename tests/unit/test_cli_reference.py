"""docs/cli.md, generated from the parser (dgx_operator.cli.reference): up to date, complete, and
the same whatever the terminal."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dgx_operator.cli.main import build_parser
from dgx_operator.cli.reference import COMMAND, main, render, usage
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "cli.md"


def _verbs(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_docs_cli_md_is_generated_from_the_parser() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/cli.md is stale: run `{COMMAND}` and commit the result"


def test_every_verb_and_every_option_is_on_the_page() -> None:
    page = render()
    verbs = _verbs(build_parser())
    for verb, sub in verbs.choices.items():
        assert f"\n## kubedgx {verb}\n" in page, verb
        assert f"(#kubedgx-{verb})" in page, verb
        section = page.split(f"\n## kubedgx {verb}\n")[1].split("\n## ")[0]
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in section, (verb, option)
    assert "`kubectl dgx VERB`" in page


def test_a_new_verb_appears_with_its_usage_help_choices_and_default() -> None:
    parser = build_parser()
    probe = _verbs(parser).add_parser(
        "probe", help="look at something", description="Look at <something> closely; *twice*."
    )
    probe.add_argument("target", metavar="TARGET", help="what to look at")
    probe.add_argument("--depth", type=int, default=3, metavar="N", help="how deep")
    probe.add_argument("--style", choices=["plain", "fancy"], default="plain", metavar="STYLE", help="how:")
    page = render(parser)
    assert "| [`probe`](#kubedgx-probe) | look at something |" in page
    section = page.split("\n## kubedgx probe\n")[1]
    assert "Look at something." in section
    assert "kubedgx probe [--depth N] [--style STYLE] TARGET" in section
    # Markdown would take <something> for an HTML tag and *twice* for emphasis.
    assert "Look at \\<something\\> closely; \\*twice\\*." in section
    assert "| `TARGET` | what to look at |  |" in section
    assert "| `--depth N` | how deep | `3` |" in section
    assert "| `--style STYLE` | how: one of `plain`, `fancy` | `plain` |" in section
    assert render() != page  # and docs/cli.md, generated from the real parser, would be stale


def test_the_page_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = render()
    monkeypatch.setenv("COLUMNS", "40")
    assert render() == wide
    long = _verbs(build_parser()).choices["operator"]
    lines = usage("kubedgx operator", long).splitlines()
    assert len(lines) > 1
    assert all(len(line) <= 100 for line in lines)
    assert all(line.startswith(" " * len("kubedgx operator ")) for line in lines[1:])


def test_the_command_writes_the_page_and_check_finds_it_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "cli.md"
    page.write_text("# old\n", encoding="utf-8")
    assert main(["--check", str(page)]) == 1
    assert f"run `{COMMAND}`" in capsys.readouterr().err
    assert main([str(page)]) == 0
    assert page.read_text(encoding="utf-8") == render()
    assert main(["--check", str(page)]) == 0
