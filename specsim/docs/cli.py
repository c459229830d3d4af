"""The command reference pages, built from the parsers' actions (not argparse's help layout,
which varies with the terminal width and the Python version)."""

from __future__ import annotations

import argparse

from specsim.docs.markdown import GENERATED, help_markdown, table


def _value_name(action: argparse.Action) -> str:
    return str(action.metavar) if action.metavar is not None else action.dest.upper()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def hidden(action: argparse.Action) -> bool:
    """Help and hidden options (an old spelling that only says what replaced it) are not
    documented."""
    return isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS


def synopsis(prog: str, parser: argparse.ArgumentParser, width: int = 96) -> str:
    """The command line's shape, wrapped at ``width`` with continuation lines indented."""
    words = []
    for action in parser._actions:
        if hidden(action):
            continue
        if isinstance(action, argparse._SubParsersAction):
            words.append("{" + ",".join(action.choices) + "} ...")
        elif not action.option_strings:
            name = _value_name(action)
            words.append(f"[{name}]" if action.nargs == "?" else name)
        else:
            word = max(action.option_strings, key=len)
            if _takes_value(action):
                word += f" {_value_name(action)}"
            if action.nargs == "+" or isinstance(action, argparse._AppendAction):
                word += " ..."
            words.append(word if action.required else f"[{word}]")
    lines, line = [], prog
    for word in words:
        if len(line) + 1 + len(word) > width:
            lines.append(line)
            line = " " * (len(prog) + 1) + word
        else:
            line += " " + word
    return "\n".join([*lines, line])


def _option_rows(actions: list[argparse.Action]) -> list[list[str]]:
    rows = []
    for action in actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{_value_name(action)}`"
        value = ""
        if action.option_strings and _takes_value(action):
            value = f"`{_value_name(action)}`" + (" (one or more)" if action.nargs == "+" else "")
        if isinstance(action, argparse._AppendAction):
            value += " (repeatable)"
        default = action.default
        unset = default is None or default is False or default == [] or default == argparse.SUPPRESS
        shown = "" if unset else f"`{default}`"
        if action.required and action.option_strings:
            shown = "**required**"
        allowed = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        rows.append([name, value, shown, allowed, option_help(action)])
    return rows


def option_help(action: argparse.Action) -> str:
    """The help text as ``--help`` shows it (``%(default)s`` expanded, ``%%`` unescaped)."""
    return (action.help or "") % {"default": action.default, "prog": "", "dest": action.dest}


GROUP_TITLES = {"positional arguments": "Arguments", "options": "Options"}


def command_section(
    prog: str, parser: argparse.ArgumentParser, level: int, parent_description: str | None = None
) -> str:
    lines = [f"{'#' * level} `{prog}`", f"```text\n{synopsis(prog, parser)}\n```"]
    # A subcommand that shares its parent's description would repeat it word for word.
    if parser.description != parent_description:
        described = help_markdown(parser.description)
        if described:
            lines.append(described)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not hidden(a)]
        actions = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        title = GROUP_TITLES.get(group.title, group.title)
        lines.append(f"**{title[0].upper()}{title[1:]}**")
        lines.append(
            table(["option", "value", "default", "allowed", "description"], _option_rows(actions))
        )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines.append(command_section(f"{prog} {name}", sub, level + 1, parser.description))
    return "\n\n".join(lines)


def cli_pages() -> dict[str, str]:
    from specsim.cli import COMMANDS, build_parser

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    pages: dict[str, str] = {}
    index = [
        "# Command reference",
        GENERATED,
        "Every command reads YAML, writes into `--out DIR` atomically (nothing half-written on "
        "an error) and prints a short summary; `--json` prints a machine-readable summary "
        "instead. Bad input gives one line naming the file, the key and the fix, and exit "
        "code 2. What each output file holds: [outputs](../outputs.md).",
    ]
    rows = []
    for name, sub in subparsers.choices.items():
        pages[f"cli/{name}.md"] = (
            command_section(f"specsim {name}", sub, 1).replace("\n\n", f"\n\n{GENERATED}\n\n", 1)
            + "\n"
        )
        rows.append([f"[`specsim {name}`]({name}.md)", COMMANDS[name]])
    index.append(table(["command", "what it does"], rows))
    pages["cli/README.md"] = "\n\n".join(index) + "\n"
    return pages


def command_names() -> set[str]:
    """Every command line the CLI accepts, e.g. ``specsim plan window``."""
    from specsim.cli import build_parser

    def walk(parser: argparse.ArgumentParser, prog: str):
        yield prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{prog} {name}")

    return set(walk(build_parser(), "specsim"))
