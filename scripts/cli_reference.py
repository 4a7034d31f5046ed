"""The command-line section of docs/reference.md, generated from the real click commands.

Contract:
- ``render()`` returns markdown for every console script that pyproject.toml's ``[project.scripts]``
  declares, in that order: one heading per command and sub-command, its help text, and a table of
  its options as its ``--help`` prints them (option, metavar, help, default, range). ``-h/--help``
  is left out (every command has it). Nothing is run: the commands are only imported.
- ``docs/reference.md`` holds that text between the ``BEGIN``/``END`` marker lines below;
  ``--write`` replaces what lies between them, ``--check`` exits 1 if it differs (what
  ``tests/test_docs.py`` asserts). Without an option the section is printed.

    .venv/bin/python scripts/cli_reference.py [--write | --check]

Importing the commands loads neither torch nor hivemind (tests/test_cli_input.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"
BEGIN = "<!-- BEGIN cli_reference.py: generated, do not edit by hand -->"
END = "<!-- END cli_reference.py -->"


def console_scripts() -> list[tuple[str, str]]:
    """(script name, "module:attribute") pairs from pyproject.toml, in the file's order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["scripts"].items())


def load_command(target: str) -> click.Command:
    module, _, attribute = target.partition(":")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{target} is not a click command")
    return command


def _cell(text: str) -> str:
    """``text`` fit for one markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _help_text(command: click.Command) -> str:
    return " ".join((command.help or command.short_help or "").split())


def _option_rows(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        if isinstance(param, click.Option) and "--help" in param.opts:
            continue
        if isinstance(param, click.Argument):
            rows.append(
                f"| `{param.make_metavar(ctx)}` | argument{' (required)' if param.required else ''} |"
            )
            continue
        record = param.get_help_record(ctx)
        if record is None:  # a hidden option
            continue
        names, help_text = record
        rows.append(f"| `{_cell(names)}` | {_cell(help_text) or ' '} |")
    return rows


def _render_command(path: str, command: click.Command, parent: click.Context | None) -> list[str]:
    ctx = click.Context(command, info_name=path.split()[-1], parent=parent)
    lines = [f"### `{path}`", ""]
    if _help_text(command):
        lines += [_help_text(command), ""]
    rows = _option_rows(command, ctx)
    if rows:
        lines += ["| option | what it does |", "|---|---|", *rows, ""]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += _render_command(f"{path} {name}", sub, ctx)
    return lines


def render() -> str:
    """The generated section (without its marker lines)."""
    lines: list[str] = []
    for script, target in console_scripts():
        lines += _render_command(script, load_command(target), None)
    return "\n".join(lines).rstrip() + "\n"


def section_in(text: str) -> str:
    """What lies between the markers of ``text``; ValueError if they are missing."""
    try:
        start = text.index(BEGIN) + len(BEGIN) + 1
        end = text.index(END)
    except ValueError:
        raise ValueError(f"{REFERENCE} lacks the lines {BEGIN!r} and {END!r}") from None
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="replace the section in docs/reference.md")
    group.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md differs")
    args = parser.parse_args(argv)
    generated = render()
    if not (args.write or args.check):
        sys.stdout.write(generated)
        return 0
    text = REFERENCE.read_text()
    current = section_in(text)
    if args.check:
        if current != generated:
            print(f"{REFERENCE} is out of date: run {Path(__file__).name} --write", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text.replace(BEGIN + "\n" + current, BEGIN + "\n" + generated, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
