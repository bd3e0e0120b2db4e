"""Where a fork's worker CPU goes: ``python -m bench.profile [--jobs N] [--top N] [--out FILE] [--stats FILE]``.

On a throwaway server, N single-fork requests of a 12-event source are queued, then worked off in
this process by the ``sessionfork worker --burst`` command (``bench.peer_runner``'s sessionfork
worker, the one ``bench.peers`` measures): once without a profiler, for the worker CPU per fork
(``getrusage``, user + system), and once more, on N new requests, under ``cProfile`` timing the
worker thread's CPU (``time.thread_time``: a wait on Redis costs the worker nothing, and is not
counted). Writes the worker CPU per fork, its own CPU summed by package, the top functions by
cumulative and by own time and sessionfork's own by cumulative time, in µs per fork, to FILE
(default ``bench-results/profile.md``) and prints it; the raw profile goes to ``--stats``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import sysconfig
import time
from pathlib import Path

from bench.measure import flushed
from bench.peer_runner import prepare
from sessionfork.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]
_PREFIXES = sorted({str(ROOT / "src") + "/", str(ROOT) + "/", sysconfig.get_paths()["purelib"] + "/",
                    sysconfig.get_paths()["stdlib"] + "/"}, key=len, reverse=True)


def where(key: tuple[str, int, str]) -> str:
    """A profiler entry's function as ``path:line(name)``, the path short (relative to the source,
    site-packages or the standard library)."""
    path, line, name = key
    for prefix in _PREFIXES:
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    return f"{path}:{line}({name})" if line else name


def package(key: tuple[str, int, str]) -> str:
    """Who owns a profiler entry's code: a distribution of site-packages (``redis``, ``rq``, ...),
    ``sessionfork``, ``bench``, the standard library, or C built-ins (``~``: their own time only)."""
    path = key[0]
    if path == "~":
        return "C built-ins (isinstance, socket calls, str and dict methods, hiredis)"
    purelib, stdlib = sysconfig.get_paths()["purelib"] + "/", sysconfig.get_paths()["stdlib"] + "/"
    if path.startswith(purelib):
        return path[len(purelib):].split("/")[0].removesuffix(".py")
    if path.startswith(str(ROOT / "src") + "/"):
        return "sessionfork"
    if path.startswith(stdlib) or path.startswith("<frozen"):
        return "standard library"
    return where(key).split("/")[0]


def by_package(stats: pstats.Stats, jobs: int) -> list[str]:
    """Own CPU per fork summed by ``package``, as markdown rows, the largest first."""
    owned: dict[str, float] = {}
    for key, (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        owned[package(key)] = owned.get(package(key), 0.0) + own
    total = sum(owned.values())
    out = ["| own CPU by package | µs/fork | share |", "|---|---:|---:|"]
    for name, own in sorted(owned.items(), key=lambda item: item[1], reverse=True):
        out.append(f"| {name} | {own / jobs * 1e6:,.1f} | {own / total:.0%} |")
    return out


def top(stats: pstats.Stats, jobs: int, by: str, n: int, only: str | None = None) -> list[str]:
    """The ``n`` functions with the most ``by`` time (``cumulative`` or ``tottime``; ``only``: of
    that ``package``), as markdown rows: calls per fork, own µs per fork, cumulative µs per fork."""
    entries = stats.stats  # type: ignore[attr-defined]
    column = 3 if by == "cumulative" else 2
    rows = sorted(((k, v) for k, v in entries.items() if only is None or package(k) == only),
                  key=lambda item: item[1][column], reverse=True)[:n]
    what = f"{only}'s functions" if only else "function"
    out = [f"| by {'own' if by == 'tottime' else by} CPU: {what} | calls/fork | own µs/fork | cumulative µs/fork |",
           "|---|---:|---:|---:|"]
    for key, (_, calls, own, cumulative, _) in rows:
        out.append(f"| `{where(key)}` | {calls / jobs:.1f} | {own / jobs * 1e6:,.1f} "
                   f"| {cumulative / jobs * 1e6:,.1f} |")
    return out


def profile(server: EmbeddedServer, jobs: int, n: int, dump: Path | None = None) -> str:
    """The report: worker CPU per fork unprofiled, own CPU by package, the top ``n`` functions both
    ways and sessionfork's own by cumulative CPU. ``dump``: the raw profile there too (pstats)."""
    flushed(server)
    plain = prepare("sessionfork", server.url, jobs)
    plain.done.start()
    plain.drain()
    per_fork = plain.done.cpu_us / jobs  # up to the last fork's outcome, as bench.peers counts it
    flushed(server)
    profiled = prepare("sessionfork", server.url, jobs)
    profiler = cProfile.Profile(time.thread_time)  # CPU, not wall time: waits on Redis are not the worker's cost
    profiler.runcall(profiled.drain)
    stats = pstats.Stats(profiler)
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(dump)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    lines = [f"Worker CPU per fork: {per_fork:,.0f} µs (getrusage over {jobs:,} forks, no profiler); under cProfile "
             f"(the worker thread's CPU, the profiler's overhead in it) {total / jobs * 1e6:,.0f} µs per fork.",
             "",
             *by_package(stats, jobs), "", *top(stats, jobs, "cumulative", n), "", *top(stats, jobs, "tottime", n),
             "", *top(stats, jobs, "cumulative", n, only="sessionfork")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.profile", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000, help="fork requests per drain")
    parser.add_argument("--top", type=int, default=30, help="functions listed each way")
    parser.add_argument("--out", default="bench-results/profile.md")
    parser.add_argument("--stats", default="bench-results/profile.pstats",
                        help="the raw profile (python -m pstats FILE, or snakeviz)")
    args = parser.parse_args(argv)
    with EmbeddedServer() as server:
        report = profile(server, args.jobs, args.top, Path(args.stats))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")
    print(report)
    print(f"\nwritten to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
