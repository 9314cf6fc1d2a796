"""py-spy for the benchmarks: a recorder attached to a running process, and the summaries of its
raw (collapsed) profile, waiting samples set aside.

`--nonblocking` (the target is never paused, so it runs at its own pace) and `--idle` off: py-spy
samples the threads the OS has runnable. Even so some samples stop in a leaf where a thread waits
(the event loop's select, a blocking read of a Redis reply, caught as the thread wakes): WAITING
lists them, and the summaries count them apart, so that what is left is CPU.

- `summarise_profile`: the hottest frames by share of the working samples (bench/gateway.py).
- `cpu_profile`: per process (a Celery pool's children apart from its main process), CPU ms per
  unit of work (a job) by function, self and inclusive, and by package (bench/jobs.py).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from bench.processes import Process

BIN = Path(sys.executable).parent
DEFAULT_RATE = 100  # samples/s, py-spy's default

# Leaves where a thread waits rather than works, by function and file (frame_key's form): the event
# loop's select, and a blocking read of a Redis reply (the router's XREADGROUP BLOCK and its
# pipeline replies: time Redis takes, not the process's CPU).
WAITING = {
    "EpollSelector.select (selectors.py)",
    "select (selectors.py)",
    "_HiredisParser.read_from_socket (_parsers/hiredis.py)",
}


def frame_key(raw: str) -> str:
    """'func (path/to/file.py:12)' -> 'func (to/file.py)': py-spy's frame without its line."""
    if " (" not in raw:
        return raw
    name, where = raw.rsplit(" (", 1)
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


def frame_label(raw: str) -> str:
    """'func (package/module.py:12)' -> 'package.module:func:12' (with py-spy's --function, the
    function's first line)."""
    if " (" not in raw:
        return raw
    name, where = raw.rsplit(" (", 1)
    path, _, line = where.rstrip(")").rpartition(":")
    if not line.isdigit():
        path, line = where.rstrip(")"), ""
    module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{module}:{name}" + (f":{line}" if line else "")


class Profiler:
    """py-spy record on a process (and with subprocesses=True its children: a Celery pool), for
    `seconds` or, with seconds=None, until stop()."""

    RATE = DEFAULT_RATE

    def __init__(
        self,
        name: str,
        pid: int,
        seconds: float | None,
        log_dir: Path,
        *,
        rate: int | None = None,
        subprocesses: bool = False,
        function: bool = False,
        gil: bool = False,
    ):
        self.name, self.pid, self.output = name, pid, log_dir / f"py-spy-{name}.txt"
        self.seconds, self.rate = seconds, rate or self.RATE
        binary = shutil.which("py-spy") or str(BIN / "py-spy")
        options = ["--nonblocking", "-r", str(self.rate), "-f", "raw", "-o", str(self.output)]
        if seconds is not None:
            options += ["-d", str(int(seconds))]
        if subprocesses:
            options.append("--subprocesses")
        if function:  # a function's samples under one line (its first): self and inclusive by function
            options.append("--function")
        if gil:  # only the thread holding the GIL: at most one sample per tick and process
            options.append("--gil")
        self.process = Process(
            binary,
            "record",
            *options,
            "-p",
            str(pid),
            name=f"py-spy-{name}",
            environ=os.environ,
            log_dir=log_dir,
        ).start()

    def stop(self) -> Path:
        """Until the duration ends (SIGINT after it, or at once without one: py-spy writes what it
        has sampled); the raw profile's path."""
        if self.seconds is not None:
            try:
                self.process.wait(timeout=self.seconds + 30)
                return self.output
            except subprocess.TimeoutExpired:
                pass
        self.process.stop(timeout=30, signum=signal.SIGINT)
        return self.output

    def finish(self) -> dict:
        """stop(), then summarise_profile over the samples the duration could hold."""
        return summarise_profile(self.stop(), (self.seconds or 0) * self.rate)


def stacks(path: Path) -> Iterator[tuple[int | None, list[str], int]]:
    """A raw profile's samples: (pid or None, frames outermost first, count). With --subprocesses
    py-spy puts `process <pid>:"<command>"` first; thread frames are left out."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        pid = None
        frames = []
        for frame in stack.split(";"):
            if frame.startswith("process "):
                digits = frame.removeprefix("process ").split(":", 1)[0]
                pid = int(digits) if digits.isdigit() else None
            elif frame and not frame.startswith("thread "):
                frames.append(frame)
        if frames:
            yield pid, frames, int(count)


def summarise_profile(path: Path, possible: float) -> dict:
    """Hottest frames of a py-spy raw (collapsed) profile, waiting samples apart: by self and
    by inclusive share of the working samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = waiting = 0
    try:
        samples = list(stacks(path))
    except OSError:
        return {"error": f"no profile at {path}"}
    for _, raw, n in samples:
        frames = [frame_key(f) for f in raw]
        if frames[-1] in WAITING:
            waiting += n
            continue
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    return {
        "samples": total,
        "waiting_samples": waiting,
        "busy": total / possible if possible else None,  # share of the run spent working
        "self": [(f, n / total) for f, n in own.most_common(15)] if total else [],
        "inclusive": [(f, n / total) for f, n in inclusive.most_common(30)] if total else [],
        "file": str(path),
    }


# Packages a frame's module is counted under (first match by module prefix), in report order.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eventbus", ("eventbus",)),
    ("idempotency", ("idempotency",)),
    ("gateway", ("gateway",)),
    ("exactly_once", ("exactly_once",)),
    ("django", ("django",)),
    ("rest_framework", ("rest_framework",)),
    ("asgiref", ("asgiref",)),
    ("psycopg", ("psycopg", "psycopg_pool", "psycopg_c", "psycopg_binary")),
    ("celery/kombu", ("celery", "kombu", "billiard", "vine", "amqp")),
    ("redis", ("redis", "hiredis")),
    ("uvicorn", ("uvicorn", "httptools", "h11", "websockets", "wsproto")),
    ("json", ("json", "orjson")),
    ("logging", ("logging",)),
    ("asyncio", ("asyncio", "selectors")),
    ("threading", ("threading", "concurrent", "queue")),
    ("importlib", ("importlib",)),  # entry points read at run time (Celery's backend lookup)
    ("bench", ("bench",)),
)
OTHER = "other"


def group_of(label: str) -> str:
    """The package group of a 'module:function:line' label."""
    module = label.split(":", 1)[0]
    for group, prefixes in GROUPS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return group
    return OTHER


def cpu_profile(
    path: Path,
    rate: int,
    units: int,
    kind: Callable[[int | None], str] = lambda pid: "",
    cpu_ms: Mapping[str, float] | None = None,
    top: int = 15,
) -> dict:
    """CPU ms per unit (a job) in a raw profile (recorded with --function), per process kind
    (`kind(pid)`: a Celery pool's children apart from its main process): the total, the `top`
    functions by self and by inclusive time ('module:function:line'), and by package group (self:
    the leaves' package, summing to the total; inclusive: samples with the package anywhere in
    the stack). Waiting samples are set aside (WAITING), counted apart.

    py-spy samples the threads the OS says are runnable: on a busy machine, those waiting for a
    core too, so its samples overstate CPU. With `cpu_ms` (a kind's CPU ms per unit that /proc
    counted over the same time) the figures share that CPU by the working samples; without it, a
    sample is 1/rate s."""
    found: dict[str, dict] = {}
    try:
        samples = list(stacks(path))
    except OSError:
        return {"error": f"no profile at {path}"}
    for pid, raw, n in samples:
        entry = found.setdefault(
            kind(pid),
            {
                "samples": 0,
                "waiting": 0,
                "waiting_leaves": collections.Counter(),
                "pids": set(),
                "self": collections.Counter(),
                "inclusive": collections.Counter(),
                "depth": collections.Counter(),
                "group_self": collections.Counter(),
                "group_inclusive": collections.Counter(),
            },
        )
        if pid is not None:
            entry["pids"].add(pid)
        if frame_key(raw[-1]) in WAITING:
            entry["waiting"] += n
            entry["waiting_leaves"][frame_label(raw[-1])] += n
            continue
        labels = [frame_label(f) for f in raw]
        entry["samples"] += n
        entry["self"][labels[-1]] += n
        entry["group_self"][group_of(labels[-1])] += n
        for label, depth in {label: depth for depth, label in enumerate(labels)}.items():
            entry["inclusive"][label] += n
            entry["depth"][label] += depth * n
        for group in {group_of(label) for label in labels}:
            entry["group_inclusive"][group] += n
    order = [group for group, _ in GROUPS] + [OTHER]
    result = {}
    for name, e in sorted(found.items()):
        sampled = e["samples"] / rate * 1000 / max(1, units)
        counted = None if cpu_ms is None else cpu_ms.get(name)
        scale = (
            (counted / e["samples"] if e["samples"] else 0.0)
            if counted is not None
            else 1000 / rate / max(1, units)
        )
        # A chain of frames always on the stack together (a server's loop, a task's call) has one
        # inclusive count: it shows once, by its innermost frame.
        innermost: dict[int, str] = {}
        for label, n in e["inclusive"].items():
            held = innermost.get(n)
            if held is None or e["depth"][label] / n > e["depth"][held] / n:
                innermost[n] = label
        chains = sorted(innermost.items(), reverse=True)
        result[name] = {
            "samples": e["samples"],
            "waiting_samples": e["waiting"],
            "waiting_leaves": [(f, n * scale) for f, n in e["waiting_leaves"].most_common(5)],
            "processes": len(e["pids"]) or 1,
            "sampled_ms_per_unit": sampled,  # what the samples say, at 1/rate s each
            "ms_per_unit": e["samples"] * scale,
            "self": [(f, n * scale, e["inclusive"][f] * scale) for f, n in e["self"].most_common(top)],
            "inclusive": [(f, n * scale, e["self"][f] * scale) for n, f in chains[:top]],
            "groups": [
                (g, e["group_self"][g] * scale, e["group_inclusive"][g] * scale)
                for g in order
                if e["group_inclusive"][g]
            ],
        }
    return result


def cpu_profile_markdown(kinds: dict, unit: str = "job") -> list[str]:
    """cpu_profile's figures as Markdown, per process kind: its totals, its package groups, its
    top functions by self and by inclusive time."""
    out: list[str] = []
    for name, p in kinds.items():
        if "error" in p:
            out += [f"**{name}**: {p['error']}", ""]
            continue
        waiting = ", ".join(f"`{f}` {ms:.2f}" for f, ms in p["waiting_leaves"])
        out += [
            f"**{name}** ({p['processes']} process{'es' if p['processes'] > 1 else ''}): "
            f"{p['ms_per_unit']:.2f} ms of CPU per {unit} (py-spy's samples alone: "
            f"{p['sampled_ms_per_unit']:.2f}); {p['samples']} working samples, {p['waiting_samples']} "
            "waiting set aside" + (f" (ms per {unit}: {waiting})" if waiting else "") + ".",
            "",
            f"| package | self ms/{unit} | inclusive ms/{unit} |",
            "|---|---:|---:|",
            *(f"| {g} | {own:.2f} | {inc:.2f} |" for g, own, inc in p["groups"]),
            "",
            f"| top by self: function | self ms/{unit} | inclusive ms/{unit} |",
            "|---|---:|---:|",
            *(f"| `{f}` | {own:.2f} | {inc:.2f} |" for f, own, inc in p["self"]),
            "",
            f"| top by inclusive (a chain of frames always together: its innermost) | inclusive ms/{unit} "
            f"| self ms/{unit} |",
            "|---|---:|---:|",
            *(f"| `{f}` | {inc:.2f} | {own:.2f} |" for f, inc, own in p["inclusive"]),
            "",
        ]
    return out
