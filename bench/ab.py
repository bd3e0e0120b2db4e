"""A/B against an older commit: ``python -m bench.ab COMMIT [--rounds N]`` (or ``python -m bench.main --ab COMMIT``).

Fan-out children/s (64 per request) and single-fork requests/s (1 worker) of ``COMMIT``'s tree and
of this one, measured in the same run, alternating (old, new, old, new, ...), so that a regression
shows in one run on a machine whose speed swings between runs. ``COMMIT``'s tree is extracted with
``git archive`` into a temporary directory; each measurement runs in a process of its own, on a
throwaway server of its own, with that tree's ``src`` first on ``PYTHONPATH`` (its workers inherit
it), while the measuring code is this tree's ``bench.measure`` for both. Prints each round, then
the medians, the new ÷ old ratios, and each tree's fan-out ÷ single ratio. Not part of CI (it
takes a minute or more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
"""This tree (its ``src`` and ``bench``)."""
FIGURES = ("fanout", "single")
LABELS = {"fanout": "fan-out children/s (64 per request)", "single": "single-fork requests/s (1 worker)"}


def measure_one(fan_requests: int, singles: int) -> dict[str, Any]:
    """One measurement of the tree this process imports ``sessionfork`` from (a fresh server)."""
    import sessionfork
    from bench.measure import fork_throughput
    from sessionfork.embedded import EmbeddedServer

    with EmbeddedServer() as server:
        fork_throughput(server, 5, count=64)  # warm up: imports, scripts, the server's first growth
        fanout = fork_throughput(server, fan_requests, count=64) * 64
        single = fork_throughput(server, singles)
    return {"tree": str(Path(sessionfork.__file__).resolve().parents[2]), "fanout": fanout, "single": single}


def extract(commit: str, into: Path) -> Path:
    """``commit``'s tree (``git archive`` of this repository) under ``into``; its directory."""
    tree = into / commit
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(HERE), "archive", "--format=tar", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run_tree(tree: Path, fan_requests: int, singles: int) -> dict[str, Any]:
    """``measure_one`` in a process importing ``tree``'s ``sessionfork`` and this tree's ``bench``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(HERE)])}
    out = subprocess.run([sys.executable, "-m", "bench.ab", "--measure-one", str(fan_requests), str(singles)],
                         env=env, cwd=HERE, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if Path(result["tree"]) != tree.resolve():
        raise RuntimeError(f"measured {result['tree']}, not {tree}: PYTHONPATH did not take")
    return result


def report(names: tuple[str, str], rounds: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The lines printed for ``rounds`` of (old, new) measurements of the trees ``names``."""
    lines = [f"| round | {names[0]} fan-out/s | {names[1]} fan-out/s | {names[0]} single/s | {names[1]} single/s |",
             "|---:|---:|---:|---:|---:|"]
    for i, (old, new) in enumerate(rounds, 1):
        lines.append(f"| {i} | {old['fanout']:,.0f} | {new['fanout']:,.0f} | {old['single']:,.1f} "
                     f"| {new['single']:,.1f} |")
    medians = [{f: statistics.median(r[side][f] for r in rounds) for f in FIGURES} for side in (0, 1)]
    lines.append("")
    for f in FIGURES:
        lines.append(f"{LABELS[f]}, median of {len(rounds)}: {names[0]} {medians[0][f]:,.1f}, "
                     f"{names[1]} {medians[1][f]:,.1f}, {names[1]} ÷ {names[0]} {medians[1][f] / medians[0][f]:.2f}x")
    for name, m in zip(names, medians, strict=True):
        lines.append(f"fan-out children/s ÷ single-fork requests/s, {name}: {m['fanout'] / m['single']:.1f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ab", description=__doc__)
    parser.add_argument("commit", nargs="?", help="the older commit (any git revision of this repository)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians kept)")
    parser.add_argument("--fan-requests", type=int, default=100, help="fan-out requests of 64 children per round")
    parser.add_argument("--singles", type=int, default=2000, help="single-fork requests per round")
    parser.add_argument("--measure-one", nargs=2, type=int, metavar=("FAN_REQUESTS", "SINGLES"),
                        help=argparse.SUPPRESS)  # the child process's side
    args = parser.parse_args(argv)
    if args.measure_one:
        print(json.dumps(measure_one(*args.measure_one)))
        return 0
    if not args.commit:
        parser.error("a commit to compare with is needed")
    names = (args.commit, "this tree")
    with tempfile.TemporaryDirectory(prefix="sessionfork-ab-") as tmp:
        old_tree = extract(args.commit, Path(tmp))
        rounds = []
        for r in range(args.rounds):
            print(f"… round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            old = run_tree(old_tree, args.fan_requests, args.singles)
            new = run_tree(HERE, args.fan_requests, args.singles)
            rounds.append((old, new))
    print("\n".join(report(names, rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
