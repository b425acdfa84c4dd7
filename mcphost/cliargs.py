"""Command-line hygiene shared by every CLI of the project.

Owns: `Parser`, the `argparse.ArgumentParser` that every argparse CLI here uses (`mcphost check`,
`relay-tools`, `devcenter`, `configgen`, `ctl`, `supervise`), and `describe_unexpected`, the
same wording for the CLIs that read argv by hand (`mcphost host`).

Two rules, both about secrets typed on a command line:
- no abbreviations (`allow_abbrev=False`): `configgen --token acat_...` must be refused, not
  silently taken for `--token-file` because `--token` is a prefix of it;
- an argument the parser does not know is named, never echoed: an option is shown by its name
  alone (`--token`, `--token=...` -> `--token`) and any other word only counted, since the word
  after a mistyped option is as likely a token as anything else. The same goes for an invalid
  choice of a positional argument: the message lists the choices (and the closest one), never
  the value given.

Must never: print a value the parser did not recognise. (`mcphost host`, whose start-up time is
multiplied by the agents on a worker, imports this module only on its error path.)
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any, NoReturn

_OPTION_NAME = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]{0,39}")
# greedy: a value that itself contains " (choose from" is taken out whole
_INVALID_CHOICE = re.compile(r"invalid choice: .* \(choose from", re.DOTALL)


def describe_unexpected(words: Sequence[str]) -> str:
    """`unrecognized arguments: --token (1 value not shown)`: option names only, values counted."""
    names: list[str] = []
    hidden = 0
    for word in words:
        name, has_value, _ = word.partition("=")
        if word.startswith("-") and _OPTION_NAME.fullmatch(name):
            if name not in names:
                names.append(name)
            hidden += bool(has_value)
        else:
            hidden += 1
    text = "unrecognized arguments: " + (" ".join(names) if names else "")
    if hidden:
        noun = "value" if hidden == 1 else "values"
        text += f"{' (' if names else ''}{hidden} {noun} not shown{')' if names else ''}"
    return text.rstrip()


def redact(message: str) -> str:
    """An argparse error message with any echoed unrecognised value taken out."""
    return _INVALID_CHOICE.sub("invalid choice (value not shown; choose from", message)


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` without abbreviations and without echoing unknown arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(describe_unexpected(extras))
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """An invalid choice: the choices (and the closest one), never the value given."""
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise argparse.ArgumentError(
            action, f"invalid choice (value not shown; {hint}choose from {', '.join(names)})"
        )

    def error(self, message: str) -> NoReturn:
        super().error(redact(message))
