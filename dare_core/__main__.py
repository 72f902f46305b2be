"""``python -m dare_core`` = ``dare`` (what ``torchrun -m dare_core train ...`` starts per rank)."""

from dare_core.cli import main

main()
