"""The test settings with the schedules a test gives the processes it starts: the JSON of
TEST_TASK_SCHEDULES becomes TASKS["default"]["OPTIONS"]["SCHEDULES"]."""

import json
import os

from config.settings.test import *  # noqa: F401,F403
from config.settings.test import TASKS

TASKS = {
    **TASKS,
    "default": {
        **TASKS["default"],
        "OPTIONS": {"SCHEDULES": json.loads(os.environ.get("TEST_TASK_SCHEDULES", "{}"))},  # type: ignore[dict-item]
    },
}
