"""What /proc says about the machine, for the benchmarks' reports: its CPU, and what every report
says of its run. A process's CPU time is tests/processes.py's (cpu_seconds, Process.session_cpu),
with its clock ticks (CLOCK_TICKS, re-exported here for the machine-wide counters)."""

import datetime
import os
import platform
import sys
from pathlib import Path

from tests.processes import CLOCK_TICKS

__all__ = ["CLOCK_TICKS", "cpu_model", "run_info"]


def cpu_model() -> str:
    """The machine's CPU, as /proc/cpuinfo names it ("" when it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def run_info(script: str) -> dict:
    """What every benchmark report says of its run: when, its command, the machine, Python,
    Django and redis-py."""
    import django
    import redis

    return {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", script, *sys.argv[1:]]),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "redis_py": redis.__version__,
    }
