"""Throughput of the code sandbox: MBPP items graded one at a time and on a pool, side by side.

    python scripts/sandbox_throughput.py                 # 64 items, pool of os.cpu_count() workers
    python scripts/sandbox_throughput.py --items 128 --workers 8

Each job is a bundled MBPP test item's asserts run after a stub program that satisfies them, so
every run executes real tests and passes: the numbers measure the sandbox's per-program cost
(process start, limits, harness, clean-up), not the cost of solutions. Prints programs per second for ``check_program`` in a loop and for
``run_many`` on a thread pool.
"""

from __future__ import annotations

import argparse
import os
import time

from dare_plugin_tasks.code import code_tests
from dare_plugin_tasks.parquet import MBPPTask
from dare_plugin_tasks.sandbox import Job, check_program, run_many


def jobs(n: int) -> list[Job]:
    """``n`` jobs: an MBPP item's asserts after a program that makes them all pass."""
    out = []
    for ex in MBPPTask().examples("eval", limit=n):
        tests, _ = code_tests(ex)
        # every assert compares a call with a value: a function returning an always-equal object passes it
        name = tests.split("assert", 1)[1].split("(", 1)[0].strip()
        program = (
            f"class _Any:\n    def __eq__(self, other):\n        return True\n"
            f"def {name}(*args, **kwargs):\n    return _Any()\n"
        )
        out.append(Job(program=program, tests=tests))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=64, help="programs per measurement")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool size for run_many")
    args = ap.parse_args(argv)
    work = jobs(args.items)
    start = time.perf_counter()
    serial = [check_program(j.program, j.tests) for j in work]
    t_serial = time.perf_counter() - start
    start = time.perf_counter()
    pooled = run_many(work, workers=args.workers)
    t_pool = time.perf_counter() - start
    passed = sum(r.status == "passed" for r in serial), sum(r.status == "passed" for r in pooled)
    print(f"{'mode':<22}{'programs':>9}{'seconds':>10}{'programs/s':>12}{'passed':>8}")
    print(f"{'one at a time':<22}{len(work):>9}{t_serial:>10.2f}{len(work) / t_serial:>12.1f}{passed[0]:>8}")
    print(
        f"{f'pool ({args.workers} workers)':<22}{len(work):>9}{t_pool:>10.2f}{len(work) / t_pool:>12.1f}{passed[1]:>8}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
