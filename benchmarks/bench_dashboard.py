"""The dashboard at 1,000 agents: its update rate, the client CPU it adds, and the browser tab's frame time.

The same fleet (``--agents`` one-task agents, ``--rounds`` tool-calling turns, ``--think`` s between turns,
``--width`` of them at once, all by default: ``--mode parallel --width N``) runs against the simulator in a
separate process (``simproc``: only the client is in this process), three times:

1. without ``--dashboard`` — the baseline client CPU (user + system seconds of this process);
2. with ``--dashboard`` and one event-stream reader — the page's stand-in, in a process of its own as a browser is,
   on the machine's other core (``--reader-on-client-core``: on the client's, where its wake-ups cost the client
   CPU; ``--reader-in-process``: in this process, so its socket and parsing count against the dashboard too) — the
   client CPU again, the share it adds, and what the stream carried. 1 and 2 run in blocks of
   four, in the order 1 2 2 1, so a shared machine's drift falls on both sides; each block gives one paired
   figure, (2 − 1) ÷ 1. Two identical runs differ by up to 14 % in client CPU on a 2-core machine, more than
   the effect sought, so ``--blocks K`` repeats the block and the share is given as the mean of the K figures
   with a 95 % interval (bootstrap over the blocks, seeded): "≤ 5 %" is shown when the interval's top is ≤ 5 %.
   ``--null`` runs the same blocks with no dashboard in any run (runs 2 and 3 stand for it): the A/A check of
   the design, which should read 0 (5 December 2026, 8 blocks: −0.6 %, 95 % interval −5.7 to +4.6 %).
   The dashboard's own CPU is timed in place in one more run with it after the blocks (``OwnTime``: its hooks,
   flushes and encoding, and the reader's parsing) as a share of that same run's client CPU, which the machine's
   drift moves far less; never in the blocks' runs, where its timers (0.5 µs on each of ~20,000 hook calls a run)
   would weigh on the arm with the dashboard alone. ``--loop-profile`` prints each run's CPU by what the event loop
   ran (the agents' work, the dashboard's stream and flusher, the socket reads). The cyclic garbage collector's
   passes and CPU are counted per arm (``gc.callbacks``): a load
   runs with ``load.collector``'s settings, and ``--default-gc`` runs both arms with Python's own, for the before;
   ``--side-by-side`` runs each block's two arms at the same time instead, in two client processes on the client's
   core against the one simulator, so the machine's drift falls on both alike (a block's noise about ±3 %, checked
   with ``--null``, where neither process has the dashboard and the figure should read 0). It reads lower than the
   arms in turn (4 December 2026: +3.0 and +3.8 % against +8.4 %, each with a narrow interval; 6 December, without
   the in-place timers: +0.8 % against +11.0 %): two processes taking turns on a core may hide the cost a lone
   client pays in its caches, so it does not replace the arms in turn. Nor can the arms in turn resolve 5 % on a
   machine whose runs drift as this VM's: ``bench_stream_cost.py`` put an aiohttp event stream with no agentload code
   in the client and read +9.3 % (95 % interval +4.6 to +14.7 %) in one run and −2.7 % (−7.7 to +2.1 %) in the next.
   ``--callgrind`` counts instead of timing: each arm's client runs alone in a process of its own under valgrind's
   callgrind, which counts the run's instructions and simulates its L1 and last-level caches (what a hardware
   counter would give; this machine's VM has none). The counts do not move with the machine's drift; the run is
   ~50-100× slower, so the dashboard's flush schedule is stretched by the slowdown measured on the same fleet (its
   flush count is printed beside a plain run's). ``--last-level BYTES`` sizes the simulated last-level cache
   (valgrind's default is the machine's L3): one core's L2 (1 MiB here) counts the misses that leave the core;
   ``--branch-sim`` simulates the branch predictor too (5 December 2026: the dashboard adds +2.7 % mispredicted
   branches for +2.9 % instructions — not where the timed figure's excess is); ``--keep-counts DIR`` keeps each
   counted run's file for ``callgrind_annotate``;
3. with ``--dashboard`` and the page open in headless Chromium (Debian's, via Playwright; skipped when absent) —
   the deltas a second the page received and its frame times (``requestAnimationFrame`` intervals: p50, p95, max).

The update rate is **deltas that carried agents' changes, per second** of the stream (first to last flush): a
delta that carries only the once-a-second server sample, and the keep-alive comment a flush sends when nothing
changed, are counted apart, never in it. Every flush sends one of the three, so together they show whether the
server kept its schedule — 4 flushes a second while anything can change (a request in flight, a page behind), none
while the dashboard is idle (the agents all thinking: the next event flushes, at once after a quiet period, else
at the rate) — and, if the rate is lower,
why: flushes with nothing to send (keep-alives), idle spells and flushes that came late (the gaps between flushes,
and the lateness of a 50 ms sleep in the same event loop: a loop starved by the run itself shows there). That rate
counts what the fleet changed, so it falls when the agents move in lockstep (all thinking at once: nothing to send
for two seconds). What the page is promised is the other side: ``--change-ages`` measures, for every delta, how long
its oldest change waited to be sent (from the first change after the previous delta) — within 1.3 periods (325 ms)
when the schedule holds (a flush rides on the run's first event from 30 % of a period before it is due, so the
next may come up to 1.3 periods later).

    .venv/bin/python benchmarks/bench_dashboard.py                   # 1,000 agents × 4 rounds, 2 s think
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300   # a 2-core machine's simulator
    .venv/bin/python benchmarks/bench_dashboard.py --agents 200 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser  # in turn
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --null  # A/A
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --decoy
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 4 --no-browser --loop-profile  # by task
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 4 --no-browser --loop-profile --no-page
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --blocks 8 --no-browser --default-gc
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --blocks 12 --side-by-side --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --side-by-side --null --blocks 12 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --callgrind --blocks 2 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 300 --callgrind --last-level 1048576 --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --width 200 --callgrind --branch-sim --keep-counts cg --no-browser
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300 --change-ages   # ages, the browser
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its modules and simproc beside it
from agentload.dashboard.server import MAX_DASHBOARD_RATE, MIN_DASHBOARD_RATE
from agentload.load import runner
from dashbench_browser import browser
from dashbench_callgrind import MISPREDICT_CYCLES, callgrind
from dashbench_inturn import in_turn
from dashbench_reader import reader_main
from dashbench_runs import FLEET, Target, child_main
from dashbench_sidebyside import side_by_side
from simproc import fast_profile, sim_process


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    if args.read_events:
        reader_main()
        return
    if args.child:
        child_main(args)
        return
    _check(ap, args)
    if args.default_gc:
        setattr(runner, "collector_for_load", contextlib.nullcontext)  # noqa: B010  (patched for the run: the "before")
    width = args.width or args.agents
    with tempfile.TemporaryDirectory() as tmp, sim_process(fast_profile(args.step)) as (_, host, port):
        fleet = Path(tmp) / "fleet.toml"
        fleet.write_text(FLEET.format(agents=args.agents, rounds=args.rounds, think=args.think))
        target = Target(fleet, Path(tmp), f"http://{host}:{port}", width)
        if args.side_by_side:
            side_by_side(args, target)
        elif args.callgrind:
            callgrind(args, target)
        else:
            in_turn(args, target)
            if not args.no_browser:
                browser(target.app(dashboard=True, rate=args.rate))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_options(ap)
    _page_options(ap)
    _design_options(ap)
    _callgrind_options(ap)
    _hidden_options(ap)
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="leave the cyclic collector as Python sets it (not load.collector's settings): the before",
    )
    return ap


def _run_options(ap: argparse.ArgumentParser) -> None:
    """The fleet, the simulator, the blocks and the page's rate."""
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--think", type=float, default=2.0)
    ap.add_argument("--width", type=int, default=None, help="agents live at once (default: all)")
    ap.add_argument("--step", type=float, default=0.02, help="the simulator's step time, s")
    ap.add_argument("--blocks", type=int, default=1, help="blocks of four runs (without, with, with, without)")
    ap.add_argument(
        "--rate", type=float, default=None, metavar="HZ",
        help="the page's updates a second (agentload run --dashboard-rate; default: the dashboard's, 4)",
    )  # fmt: skip


def _page_options(ap: argparse.ArgumentParser) -> None:
    """The page's stand-in and what the arms in turn measure beside the client CPU."""
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument(
        "--reader-in-process",
        action="store_true",
        help="read the event stream in the client's process (its parsing and socket count as the client's CPU), "
        "not in a process of its own as a browser would",
    )
    ap.add_argument(
        "--reader-on-client-core",
        action="store_true",
        help="leave the reader's process on the client's core (by default it runs on the machine's other cores, "
        "where a browser would: sharing the client's core costs the client CPU the dashboard does not spend)",
    )
    ap.add_argument(
        "--change-ages",
        action="store_true",
        help="also measure how long each change waits to reach the stream (a wrapper on every change: in the extra "
        "run that times the dashboard's code in place, never in the blocks' runs)",
    )
    ap.add_argument(
        "--loop-profile",
        action="store_true",
        help="in turn: also time each callback the event loop runs, and print each run's CPU by what it ran (the "
        "agents' work, the dashboard's tasks, the socket reads): which work differs between the arms",
    )
    ap.add_argument(
        "--no-page",
        action="store_true",
        help="in turn: the runs with the dashboard serve it with no page open (no stream, so no flushes): what its "
        "hooks and its presence cost the client without the page's updates",
    )


def _design_options(ap: argparse.ArgumentParser) -> None:
    """The designs: side by side, the A/A check, callgrind's counts, the decoy."""
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="each block runs the two arms at the same time, in two processes on the client's core against the same "
        "simulator (the machine's drift falls on both alike), instead of one after the other in this process",
    )
    ap.add_argument(
        "--null",
        action="store_true",
        help="with --side-by-side: the run 'with' has no dashboard either, so the figure shows what the design alone "
        "reads (an A/A check: it should be near 0)",
    )
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="count each arm's instructions and simulated cache misses under valgrind's callgrind, in a process of "
        "its own, instead of timing CPU: counts do not drift with the machine (each run takes minutes)",
    )
    ap.add_argument(
        "--decoy",
        action="store_true",
        help="in turn: each run without the dashboard gets a process where the page's reader would be (the other "
        "core), waking at the flush rate and spending the reader's CPU, so that only the client's own cost differs",
    )


def _callgrind_options(ap: argparse.ArgumentParser) -> None:
    """What ``--callgrind`` simulates and keeps."""
    ap.add_argument(
        "--last-level",
        metavar="BYTES",
        type=int,
        default=None,
        help="with --callgrind: the simulated last-level cache's size (8-way, 64-byte lines; default: valgrind's, the "
        "machine's L3): the size of one core's L2 counts the misses that leave the core, where a lone client's "
        "working set and the dashboard's compete",
    )
    ap.add_argument(
        "--branch-sim",
        action="store_true",
        help=f"with --callgrind: simulate the branch predictor too, and count mispredicted branches (at "
        f"{MISPREDICT_CYCLES} cycles each in a second cycle estimate): whether the dashboard's code, interleaved "
        "with the client's, costs the interpreter's dispatch its predictions",
    )
    ap.add_argument(
        "--keep-counts",
        metavar="DIR",
        type=Path,
        default=None,
        help="with --callgrind: keep each counted run's callgrind file in DIR (callgrind_annotate reads them)",
    )


def _hidden_options(ap: argparse.ArgumentParser) -> None:
    """A helper process's own: the reader's, an arm's child."""
    ap.add_argument("--read-events", action="store_true", help=argparse.SUPPRESS)  # the reader's own process
    ap.add_argument("--child", choices=("with", "without"), help=argparse.SUPPRESS)  # one arm of --side-by-side
    ap.add_argument("--flush-scale", type=float, default=1.0, help=argparse.SUPPRESS)  # a child's flush schedule
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)  # a child under callgrind
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--fleet", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options that do not go together, and the values out of range: one usage error each."""
    if args.callgrind and (args.side_by_side or args.default_gc or args.reader_in_process):
        ap.error("--callgrind runs neither --side-by-side, --default-gc nor --reader-in-process")
    if args.no_page and (args.callgrind or args.side_by_side or args.null or args.decoy or args.reader_in_process
                         or args.change_ages):  # fmt: skip
        ap.error("--no-page is for the arms in turn, with the dashboard, no reader and no --change-ages")
    if args.loop_profile and (args.callgrind or args.side_by_side):
        ap.error("--loop-profile is for the arms in turn (this process runs them)")
    if args.decoy and (args.callgrind or args.side_by_side or args.reader_in_process):
        ap.error("--decoy is for the arms in turn with the reader in a process of its own")
    if args.null and (args.callgrind or args.default_gc or args.reader_in_process):
        ap.error("--null is a check of the timed designs (in turn or --side-by-side)")
    if args.side_by_side and (args.default_gc or args.reader_in_process):
        ap.error("--side-by-side runs neither --default-gc nor --reader-in-process")
    if args.blocks < 1:
        ap.error("--blocks must be at least 1")
    if args.rate is not None and not MIN_DASHBOARD_RATE <= args.rate <= MAX_DASHBOARD_RATE:
        ap.error(f"--rate is the page's updates a second, {MIN_DASHBOARD_RATE:g} to {MAX_DASHBOARD_RATE:g}")
    if (args.branch_sim or args.keep_counts is not None) and not args.callgrind:
        ap.error("--branch-sim and --keep-counts are options of --callgrind")
    if args.last_level is not None and (not args.callgrind or args.last_level < 65536 or args.last_level & 4095):
        ap.error("--last-level is a size in bytes for --callgrind's cache (at least 64 KiB, a multiple of 4 KiB)")


if __name__ == "__main__":
    main()
