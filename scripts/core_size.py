"""Print the size of the core: non-blank lines of ``dare_core/**/*.py`` per package and in all.

    python scripts/core_size.py            # the table and the total
    python scripts/core_size.py --check    # exit 1 when the total exceeds the budget (6,400)
"""

from __future__ import annotations

import pathlib
import sys

BUDGET = 6400
ROOT = pathlib.Path(__file__).resolve().parents[1] / "dare_core"


def count(path: pathlib.Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def sizes() -> dict[str, int]:
    """Non-blank lines per top-level package or module of ``dare_core``."""
    out: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        key = rel.parts[0] if len(rel.parts) > 1 else rel.name
        out[key] = out.get(key, 0) + count(path)
    return out


def main(argv: list[str]) -> int:
    table = sizes()
    width = max(len(k) for k in table)
    for key, n in sorted(table.items(), key=lambda kv: -kv[1]):
        print(f"{key:<{width}}  {n:>5}")
    total = sum(table.values())
    print(f"{'total':<{width}}  {total:>5}  (budget {BUDGET})")
    return 1 if "--check" in argv and total > BUDGET else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
