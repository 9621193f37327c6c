"""The `transerve` console script (pyproject's [project.scripts]): `transerve serve ...` is `python -m service
...` (which keeps working), `transerve translate ...` the bulk command (service/bulk/)."""

from __future__ import annotations

import sys

USAGE = """usage: transerve {serve,translate} ...

  serve       serve models over HTTP (as python -m service; transerve serve --help)
  translate   translate a file or standard input (transerve translate --help; docs/bulk.md)
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "serve":
        from .__main__ import main as serve

        return serve(rest)
    if command == "translate":
        from .bulk.command import main as translate

        return translate(rest)
    sys.stderr.write(USAGE if command not in ("-h", "--help") else "")
    if command in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
