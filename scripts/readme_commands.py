"""Print one of the README's two set-up commands (standard library only: it runs before anything is installed).

``python3 scripts/readme_commands.py 1`` prints the first (install and run the main job), ``2`` the second (the
test command): the first two ``bash`` blocks of README.md's "Set up and run" section. ``.ci/run`` runs them in
that order in one checkout, as a newcomer does, so that CI tests what the README says.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Set up and run"
FENCE = re.compile(r"^```bash[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands(text: str) -> list[str]:
    """The ``bash`` blocks of the set-up section, in order."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return [m.group(1).strip() for m in FENCE.finditer(text[start : end if end >= 0 else len(text)])]


def main(argv: list[str]) -> int:
    found = commands(README.read_text(encoding="utf-8"))
    if len(argv) != 1 or argv[0] not in ("1", "2") or len(found) < 2:
        print(
            f"usage: readme_commands.py 1|2 (README.md's set-up section has {len(found)} bash blocks)", file=sys.stderr
        )
        return 2
    print(found[int(argv[0]) - 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
