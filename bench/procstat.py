"""What /proc says about the machine and its processes, for the benchmarks' reports and CPU
accounting."""

import datetime
import os
import platform
import sys
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


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
