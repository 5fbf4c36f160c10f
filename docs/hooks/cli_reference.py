"""MkDocs hook: the CLI reference page, generated from ``tasklease.cli.build_parser()``.

Every subcommand is walked, so a new flag appears in the docs when it appears in ``--help``:
usage, each argument with its help and default (the same text ``--help`` prints).
"""

from __future__ import annotations

import argparse
import html
from collections.abc import Iterator
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "reference/cli.md"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for name, sub in _subcommands(parser):
        yield from _walk(sub, (*path, name))


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    from tasklease.cli.common import help_with_default  # noqa: PLC0415

    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = (
                formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
            )
            names = ", ".join(f"{name} {metavar}".strip() for name in action.option_strings)
        else:
            names = formatter._metavar_formatter(action, action.dest)(1)[0]
        text = help_with_default(action) % {**vars(action), "prog": parser.prog}
        if action.choices and not isinstance(action.choices, dict):
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| `{names}` | {html.escape(text, quote=False).replace('|', '&#124;')} |")
    return rows


def render() -> str:
    """The whole page, in Markdown."""
    from tasklease.cli import build_parser  # noqa: PLC0415

    lines = [
        "# CLI reference",
        "",
        "Generated from the `tasklease` command's own argument definitions when the site is",
        "built: what `tasklease COMMAND --help` prints, every flag with its default.",
        "",
    ]
    for path, parser in _walk(build_parser(), ("tasklease",)):
        lines += [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", ""]
        if parser.description:
            lines += [parser.description.strip().splitlines()[0], ""]
        usage = parser.format_usage().removeprefix("usage: ").strip().splitlines()
        usage = [usage[0], *("    " + line.strip() for line in usage[1:])]
        lines += ["```text", *usage, "```", ""]
        subcommands = list(_subcommands(parser))
        if subcommands:
            lines += ["| command | what it does |", "|---|---|"]
            for name, sub in subcommands:
                anchor = "-".join((*path, name))
                summary = (sub.description or "").strip().splitlines()[0:1]
                lines.append(f"| [`{name}`](#{anchor}) | {''.join(summary)} |")
            lines.append("")
        rows = _argument_rows(parser)
        if rows:
            lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    """Add the generated page to the site (it exists nowhere on disk)."""
    files.append(File.generated(config, PAGE, content=render()))
    return files
