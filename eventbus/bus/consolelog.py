"""The bus's commands say what they do even in a project without LOGGING.

Django's default logging configures its own "django" logger only: the "eventbus" loggers'
INFO lines (a command's start, a job enqueued again by the sweep) would go nowhere, and a
router or sweeper that runs fine would print nothing at all. A long-running command calls
`ensure_console()` first: when no handler of the project's own would receive the "eventbus"
loggers' records, they go to stderr from INFO up. A project with its own LOGGING keeps it.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def ensure_console(name: str = "eventbus") -> bool:
    """Give the logger `name` a stderr handler at INFO unless one of the project's receives it
    already; True when it did."""
    logger = logging.getLogger(name)
    if logger.hasHandlers():
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return True
