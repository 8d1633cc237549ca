"""The CLI reference, generated at build time from the real argparse parsers (generated_pages.py).

One section per command and subcommand (usage, description, a table of its arguments with their
defaults), walking the parsers ``taiji`` itself builds. A command that main() hands to another
parser (``taiji sched``, ``taiji sched simulate``, ``taiji checkpoint``) is read from that one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator


def delegated() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """The commands whose options live in a parser of their own, by their full name."""
    from taiji.launch import checkpoint_cli
    from taiji.launch.sched import cli as sched_cli
    from taiji.sched import cli as simulate_cli

    return {
        "taiji sched": sched_cli.build_parser,
        "taiji sched simulate": lambda: subcommands(simulate_cli.build_parser())["simulate"][0],
        "taiji checkpoint": checkpoint_cli.build_parser,
    }


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """A parser's subcommands: name -> (parser, one-line help)."""
    found: dict[str, tuple[argparse.ArgumentParser, str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found[name] = (sub, helps.get(name, ""))
    return found


def walk(
    name: str, parser: argparse.ArgumentParser, summary: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Every command under ``parser`` (itself first), depth first, delegated parsers followed."""
    own = delegated().get(name)
    if own is not None:
        parser = own()
    yield name, parser, summary
    for sub_name, (sub, help_text) in subcommands(parser).items():
        yield from walk(f"{name} {sub_name}", sub, help_text)


def commands() -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """`taiji` and its subcommands, then those main() routes before parsing (`taiji checkpoint`)."""
    from taiji.launch.parser import build_parser

    seen = set()
    for found in walk("taiji", build_parser()):
        seen.add(found[0])
        yield found
    for name, build in delegated().items():
        if name not in seen:
            yield from walk(name, build(), build().description or "")


def cell(text: str) -> str:
    """Text made safe for one Markdown table cell: pipes escaped outside code spans (inside one, a
    pipe does not split the cell)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if (
            isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            or action.help == argparse.SUPPRESS
        ):
            continue
        if action.option_strings:
            takes = action.nargs != 0
            metavar = formatter._metavar_formatter(action, action.dest.upper())(1)[0] if takes else ""
            flag = ", ".join(f"`{o}{' ' + metavar if metavar else ''}`" for o in action.option_strings)
        else:
            flag = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
        help_text = formatter._expand_help(action) if action.help else ""
        default = ""
        if (
            action.option_strings
            and action.default not in (None, False, "", argparse.SUPPRESS)
            and "%(default)" not in (action.help or "")
        ):
            default = f"`{action.default}`"
        rows.append(f"| {cell(flag)} | {cell(help_text)} | {default} |")
    return rows


def render() -> str:
    """The whole reference, in Markdown."""
    out = []
    for name, parser, summary in commands():
        level = "#" * min(2 + name.count(" "), 4)
        out.append(f"{level} `{name}`\n")
        if summary:
            out.append(f"{summary}\n")
        out.append(f"```text\n{parser.format_usage().strip()}\n```\n")
        if parser.description and parser.description != summary:
            out.append(f"{parser.description.strip()}\n")
        rows = argument_rows(parser)
        if rows:
            out.append("| argument | meaning | default |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)
