"""Verify the Promela model of the reliability protocol (spec/dfpubsub.pml) with Spin.

``./dev model`` runs every configuration of :data:`CONFIGS` (each must verify: no assertion
violated, no invalid end state, the search complete) and every seeded bug of :data:`BUGS` (each
must be refuted: Spin finds a counterexample). docs/model.md explains the model, the
configurations and the bugs. Spin (Debian's ``spin``) writes the verifier's C source, gcc
compiles it. Each run works in a directory of its own, so that a trail (the counterexample) is
kept there; a failure names it and prints the trail's steps.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = ["BUGS", "CONFIGS", "MODEL", "Outcome", "bug_flags", "verify"]

MODEL = Path(__file__).resolve().parents[1] / "spec" / "dfpubsub.pml"

#: name -> (-D flags, what it covers). Small enough for CI: each is an exhaustive search.
CONFIGS: dict[str, tuple[tuple[str, ...], str]] = {
    "publishers": (("-DMAXW=2", "-DCH=2", "-DDUPS=0", "-DNO_TRIM", "-DNO_STOREFAIL", "-DNO_CKPT", "-DNO_BOOKMARK"),
                   "NbApi publishing directly and dying, saying bye, restarting; df-feed beside it"),
    "feed": (("-DMAXW=2", "-DCH=2", "-DDUPS=0", "-DNO_DIRECT", "-DNO_DEATH"),
             "df-feed alone: a batch whose store fails, a trimmed feed, bookmarks, a checkpoint"),
    "adversary": (("-DMAXW=2", "-DCH=2", "-DADV=1", "-DNO_FEED", "-DNO_DEATH", "-DNO_TRIM", "-DNO_STOREFAIL",
                   "-DNO_BOOKMARK"),
                  "a forged frame: far ahead, a forged version, an unknown id, or a forged bookmark"),
    "channel": (("-DMAXW=3", "-DCH=3", "-DDUPS=1", "-DNO_FEED", "-DNO_DEATH", "-DNO_TRIM", "-DNO_STOREFAIL"),
                "NbApi alone through a channel that also duplicates, a checkpoint"),
}


class Bug(NamedTuple):
    """A seeded bug: the configuration that must refute it, the mistake it reintroduces, and the
    assertion that must fail (a piece of its text as spin prints it, so that another rule failing
    first is not taken for the bug's refutation)."""

    config: str
    mistake: str
    rule: str


EQUAL = "cver[rk]==sver[rk]"  # after every repair the cache equals the store; no write missed silently
BUGS: dict[str, Bug] = {
    "BUG_HOLE_DELIVER": Bug("channel", "an envelope that arrives inside a given-up hole is delivered",
                            "sdel["),  # delivery in sequence order
    "BUG_TOMB_MAX": Bug("adversary", "a repair's tombstone keeps max(version, position), not min",
                        "cver[rk]!=15"),  # a forged version lasts only until the next repair
    "BUG_RELIST_SOME": Bug("feed", "a history_gone relist relists only the topics asked for",
                           "relist_trims!=trims"),  # no livelock of repairs
    "BUG_PROGRESS_AHEAD": Bug("feed", "the replay's reader reaches the head before the entries "
                                      "(etcd's progress notifications)", EQUAL),
    "BUG_FEED_DROP": Bug("feed", "df-feed drops a batch whose publishing failed (issue 45)", EQUAL),
    "BUG_NO_FLOOR": Bug("feed", "the controller applies an event at or below its topic's position", EQUAL),
    "BUG_STEP_DOWN_PASSES": Bug("adversary", "a frame inside a claimed run steps the stream down to itself, passing "
                                             "the run below it", "advenv||"),  # a forged claim costs a resync only
}


def overridden(flags: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` with ``extra`` added, an extra ``-DNAME=...`` replacing the flag of that name (spin's
    preprocessor would keep the first definition or the last, with a warning)."""
    names = {f.partition("=")[0] for f in extra}
    return (*(f for f in flags if f.partition("=")[0] not in names), *extra)


def bug_flags(bug: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The -D flags that put ``bug`` back in its configuration (with ``extra`` besides)."""
    return overridden(CONFIGS[BUGS[bug].config][0], (*extra, f"-D{bug}"))


@dataclass
class Outcome:
    """What one verification found."""

    errors: int
    complete: bool
    states: int
    memory_mb: float
    seconds: float
    depth: int
    workdir: Path
    output: str
    trail: str  # the counterexample's steps, "" without one

    @property
    def verified(self) -> bool:
        return self.errors == 0 and self.complete

    def refutes(self, bug: str) -> bool:
        """Whether this run found ``bug``: the rule the bug breaks failed (not another one first)."""
        return self.errors > 0 and BUGS[bug].rule in self.trail

    @property
    def trail_path(self) -> Path:
        return self.workdir / f"{MODEL.name}.trail"


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise FileNotFoundError(f"{name} is missing: ./dev installs it (APT_PACKAGES: spin, gcc)")
    return exe


def verify(flags: tuple[str, ...] | list[str], workdir: Path | None = None, *, timeout: float = 600,
           hash_bits: int = 24) -> Outcome:
    """Generate, compile and run the verifier for the model with ``flags`` (``-D...``) in
    ``workdir`` (a new temporary directory if None); the trail's steps when it fails."""
    workdir = Path(tempfile.mkdtemp(prefix="dfpubsub-model-")) if workdir is None else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    spin, gcc = _tool("spin"), _tool("gcc")
    shutil.copy(MODEL, workdir / MODEL.name)
    gen = subprocess.run([spin, *flags, "-a", MODEL.name], cwd=workdir, capture_output=True, text=True,
                         timeout=60)
    if gen.returncode != 0:
        raise RuntimeError(f"spin -a failed:\n{gen.stdout}{gen.stderr}")
    # SAFETY: assertions and end states only (the properties are assertions); NOREDUCE: one
    # process, nothing for partial-order reduction to do. -O1: gcc -O2 takes 6 s on pan.c, -O1
    # 2.5 s, and the search of 4 M states is 0.7 s slower (a seeded bug's, shorter, is no slower).
    cc = subprocess.run([gcc, "-O1", "-DSAFETY", "-DNOREDUCE", "-DMEMLIM=4096", "-w", "-o", "pan", "pan.c"],
                        cwd=workdir, capture_output=True, text=True, timeout=300)
    if cc.returncode != 0:
        raise RuntimeError(f"gcc failed:\n{cc.stdout}{cc.stderr}")
    start = time.monotonic()
    run = subprocess.run(["./pan", "-m1000000", f"-w{hash_bits}"], cwd=workdir, capture_output=True, text=True,
                         timeout=timeout)
    seconds = time.monotonic() - start
    out = run.stdout + run.stderr
    trail = ""
    if (workdir / f"{MODEL.name}.trail").exists():
        sim = subprocess.run([spin, *flags, "-t", "-B", MODEL.name], cwd=workdir, capture_output=True, text=True,
                             timeout=120)
        steps = [line.strip()[5:] for line in sim.stdout.splitlines() if line.strip().startswith("STEP")]
        failed = [line.strip() for line in (sim.stdout + sim.stderr).splitlines() if "assertion" in line]
        trail = "\n".join(steps + failed)
    return Outcome(errors=_int(r"errors: (\d+)", out), complete="Search not completed" not in out,
                   states=_int(r"(\d+) states, stored", out), memory_mb=_float(r"([\d.]+)\s+total actual memory", out),
                   seconds=seconds, depth=_int(r"depth reached (\d+)", out), workdir=workdir, output=out, trail=trail)


def _int(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else -1


def _float(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else -1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="configurations or seeded bugs to run (default: all)")
    parser.add_argument("--dir", default=None, help="keep each run's files (and trails) under this directory")
    parser.add_argument("-D", dest="defines", action="append", default=[],
                        help="an extra -D for every run (e.g. -D MAXW=4 for larger bounds)")
    args = parser.parse_args(argv)
    names = args.names or [*CONFIGS, *BUGS]
    extra = tuple(f"-D{d}" for d in args.defines)
    failed = 0
    for name in names:
        if name in CONFIGS:
            flags, expect_ok = overridden(CONFIGS[name][0], extra), True
        elif name in BUGS:
            flags, expect_ok = bug_flags(name, extra), False
        else:
            print(f"model: no configuration or seeded bug named {name!r}", file=sys.stderr)
            return 2
        workdir = Path(args.dir, name) if args.dir else None
        got = verify(flags, workdir)
        good = got.verified if expect_ok else got.refutes(name)
        failed += not good
        what = "verified" if got.verified else ("refuted" if got.errors else "incomplete")
        print(f"{'ok  ' if good else 'FAIL'} {name}: {what}, {got.states} states, depth {got.depth}, "
              f"{got.memory_mb:.0f} MB, {got.seconds:.1f} s ({' '.join(flags)})")
        if not good and got.trail:
            print(f"     trail: {got.trail_path}\n" + "\n".join(f"     {s}" for s in got.trail.splitlines()))
        if workdir is None and good:
            shutil.rmtree(got.workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
