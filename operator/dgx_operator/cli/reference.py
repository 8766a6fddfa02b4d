"""docs/cli.md, the reference of the ``kubedgx`` command, generated from its parser.

``python -m dgx_operator.cli.reference docs/cli.md`` rewrites the page; ``--check`` exits 1 when it is
stale (tests/unit/test_cli_reference.py fails then too). Every verb of :func:`build_parser` gets a
section: its usage line, its description and a table of its arguments (help, choices, default),
read from argparse's actions. The text is formatted here, not by argparse's ``HelpFormatter``, so
it does not depend on the terminal's width or on the Python version's help layout.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

#: The page's path in a checkout, and the command that writes it.
DEFAULT_PAGE: Final = "docs/cli.md"
COMMAND: Final = f"python -m dgx_operator.cli.reference {DEFAULT_PAGE}"
#: Where usage lines wrap.
WIDTH: Final = 100


def _subcommands(parser: argparse.ArgumentParser) -> tuple[argparse._SubParsersAction[Any], dict[str, str]]:
    """The parser's verbs (in the order they were added) and each one's one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return action, helps
    raise ValueError(f"{parser.prog}: no subcommands")


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar) if not isinstance(action.metavar, tuple) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _args(action: argparse.Action) -> str:
    """What follows the option (or stands for the positional): ``FILE [FILE ...]``, ``[N]``, ``N``."""
    if action.nargs == 0:
        return ""
    name = _metavar(action)
    if action.nargs is None or action.nargs == 1:
        return name
    if action.nargs == "?":
        return f"[{name}]"
    if action.nargs == "*":
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    if isinstance(action.nargs, int):
        return " ".join([name] * action.nargs)
    if action.nargs == argparse.PARSER:
        return f"{name} ..."
    return name  # argparse.REMAINDER: none in this parser


def _shown(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)


def _usage_part(action: argparse.Action) -> str:
    if not action.option_strings:
        return _args(action)
    flag = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        flag = " | ".join(action.option_strings)
    args = _args(action)
    return f"{flag} {args}" if args else flag


def usage(prog: str, parser: argparse.ArgumentParser, width: int = WIDTH) -> str:
    """The usage line as argparse builds it (options, then positionals; a mutually exclusive group
    as ``[a | b]``), wrapped at ``width`` under the first argument."""
    grouped: dict[int, argparse._MutuallyExclusiveGroup] = {}
    for exclusive in parser._mutually_exclusive_groups:
        for action in exclusive._group_actions:
            grouped[id(action)] = exclusive
    parts: list[str] = []
    done: set[int] = set()
    actions = [a for a in parser._actions if _shown(a)]
    for action in [a for a in actions if a.option_strings] + [a for a in actions if not a.option_strings]:
        group = grouped.get(id(action))
        if group is not None:
            if id(group) in done:
                continue
            done.add(id(group))
            members = " | ".join(_usage_part(a) for a in group._group_actions if _shown(a))
            parts.append(f"({members})" if group.required else f"[{members}]")
        elif action.option_strings and not action.required:
            parts.append(f"[{_usage_part(action)}]")
        else:
            parts.append(_usage_part(action))
    lines = textwrap.wrap(
        " ".join(p.replace(" ", "\0") for p in parts),
        width=width,
        initial_indent=f"{prog} ",
        subsequent_indent=" " * (len(prog) + 1),
        break_on_hyphens=False,
        break_long_words=False,
    )
    return "\n".join(line.replace("\0", " ") for line in lines) if parts else prog


def _md(text: str) -> str:
    """Help text as Markdown prose: one line, and the characters Markdown would take for markup
    escaped (``<job>`` is not an HTML tag, ``KUBEDGX_*`` no emphasis)."""
    text = " ".join(text.split()).replace("\\", "\\\\")
    for char in "*<>[]`":
        text = text.replace(char, "\\" + char)
    return text


def _cell(text: str) -> str:
    return _md(text).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    """The default when it says something: a string or number (not None, not a flag's False, not a
    parsed object such as usage's period, whose help names it)."""
    value = action.default
    if value is None or value is argparse.SUPPRESS or isinstance(value, bool) or action.nargs == 0:
        return ""
    if isinstance(value, str | int | float | Path):
        return f"`{value}`"
    return ""


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:  # argparse's own expansion, as --help would print it
        text = text % {**vars(action), "prog": prog}
    return text


def _choices(action: argparse.Action) -> str:
    """The choices an option's metavar hides (``-o {a,b}`` shows them already)."""
    if action.choices is None or action.metavar is None:
        return ""
    return "one of " + ", ".join(f"`{c}`" for c in action.choices).replace("|", "\\|")


def arguments_table(prog: str, parser: argparse.ArgumentParser) -> str:
    rows = ["| Argument | Meaning | Default |", "|---|---|---|"]
    for action in parser._actions:
        if not _shown(action):
            continue
        if action.option_strings:
            args = _args(action)
            names = ", ".join(f"`{o} {args}`" if args else f"`{o}`" for o in action.option_strings)
        else:
            names = f"`{_args(action)}`"
        meaning = " ".join(p for p in (_cell(_help(action, prog)), _choices(action)) if p)
        rows.append(f"| {names} | {meaning} | {_default(action)} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def _fill(text: str) -> str:
    """A description as one paragraph on one line: wrapped, a line could begin with a ``-`` or a
    ``#`` and turn into a list item or a heading."""
    return _md(text)


def _section(prog: str, summary: str, parser: argparse.ArgumentParser) -> str:
    parts = [f"## {prog}", ""]
    if summary:
        parts += [_md(summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")), ""]
    parts += ["```text", usage(prog, parser), "```", ""]
    if parser.description:
        parts += [_fill(parser.description), ""]
    table = arguments_table(prog, parser)
    if table:
        parts += [table, ""]
    return "\n".join(parts)


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/cli.md: an introduction, the command's own options, then one section per verb."""
    if parser is None:
        from dgx_operator.cli.main import build_parser

        parser = build_parser()
    sub, helps = _subcommands(parser)
    prog = parser.prog
    verbs = list(sub.choices)
    intro = [
        f"# The `{prog}` command",
        "",
        f"Generated by `{COMMAND}` from the parser (`build_parser` in",
        "`operator/dgx_operator/cli/main.py`); do not edit: a test fails when this page and the parser differ.",
        "",
        f"Every verb is also a kubectl plugin: `kubectl dgx VERB` runs `{prog} VERB` with the same arguments",
        "(the `kubectl-dgx` executable installed with kubedgx, found by kubectl on PATH, krew's convention).",
        f"`{prog} VERB --help` prints the same text in the terminal. A walk-through of the verbs on a",
        "cluster is in [first-job.md](first-job.md); the Python client that does the same is in",
        "[client.md](client.md).",
        "",
    ]
    if parser.description:
        intro += [_fill(parser.description), ""]
    intro += ["```text", usage(prog, parser), "```", ""]
    intro += ["| Verb | What it does |", "|---|---|"]
    intro += [f"| [`{v}`](#{prog}-{v}) | {_cell(helps.get(v, ''))} |" for v in verbs]
    intro.append("")
    sections = [_section(f"{prog} {verb}", helps.get(verb, ""), sub.choices[verb]) for verb in verbs]
    return "\n".join(intro) + "\n" + "\n".join(sections).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dgx_operator.cli.reference [--check] [docs/cli.md]``."""
    parser = argparse.ArgumentParser(prog="python -m dgx_operator.cli.reference", description=__doc__)
    parser.add_argument("page", nargs="?", default=DEFAULT_PAGE, help=f"where to write (default {DEFAULT_PAGE})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = Path(args.page)
    text = render()
    if args.check:
        current = page.read_text(encoding="utf-8") if page.exists() else ""
        if current != text:
            print(f"{page} is stale: run `{COMMAND}` and commit the result", file=sys.stderr)
            return 1
        return 0
    page.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
