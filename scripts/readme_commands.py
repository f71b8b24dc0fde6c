"""The README's two commands, read from README.md so that CI runs exactly what a user is told to.

    python scripts/readme_commands.py setup   # the set-up block (make a venv, install, run the demo)
    python scripts/readme_commands.py test    # the test command

Each is the first ``sh`` block after its lead-in under "## The two commands" (``Set up`` and ``Run the
tests``), printed as one shell script.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## The two commands"
LEADS = {"setup": "Set up", "test": "Run the tests"}


def command(which: str, text: str | None = None) -> str:
    """The shell lines of the README's ``which`` command (``setup`` or ``test``); ValueError if the README lacks it."""
    text = README.read_text(encoding="utf-8") if text is None else text
    start = text.find(SECTION)
    if start < 0:
        raise ValueError(f"README.md has no {SECTION!r} section")
    body = text[start + len(SECTION):]
    end = re.search(r"^## ", body, re.M)
    body = body[: end.start()] if end else body
    lead = body.find(LEADS[which])
    if lead < 0:
        raise ValueError(f"README.md's {SECTION!r} has no paragraph starting {LEADS[which]!r}")
    block = re.search(r"^```sh\n(.*?)^```", body[lead:], re.M | re.S)
    if block is None or not block.group(1).strip():
        raise ValueError(f"README.md: no sh block after {LEADS[which]!r}")
    return block.group(1).strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=sorted(LEADS))
    args = ap.parse_args(argv)
    print(command(args.which))
    return 0


if __name__ == "__main__":
    sys.exit(main())
