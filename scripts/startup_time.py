"""Wall time of the ``dare`` commands that only read plugin specs, next to ``import torch``.

    python scripts/startup_time.py             # best of 3 runs per command
    python scripts/startup_time.py --runs 5

Each command runs in a fresh process (``python -m dare_core ...``, every installed plugin
loaded); the table shows the best wall time of each and its ratio to ``python -c "import torch"``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

COMMANDS = {
    "dare --help": ["-m", "dare_core", "--help"],
    "dare list": ["-m", "dare_core", "list"],
    "dare plugins": ["-m", "dare_core", "plugins"],
    'python -c "import torch"': ["-c", "import torch"],
}


def best_time(args: list[str], runs: int) -> float:
    """The shortest wall time of ``runs`` fresh ``python ARGS`` processes, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"python {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return min(times)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per command (the best is shown)")
    runs = parser.parse_args(argv).runs
    best_time(COMMANDS["dare --help"], 1)  # warm the file cache once
    seconds = {label: best_time(args, runs) for label, args in COMMANDS.items()}
    torch_s = seconds['python -c "import torch"']
    width = max(map(len, seconds))
    print(f"{'command':<{width}}  {'seconds':>7}  {'/ import torch':>14}")
    for label, s in seconds.items():
        print(f"{label:<{width}}  {s:>7.2f}  {s / torch_s:>14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
