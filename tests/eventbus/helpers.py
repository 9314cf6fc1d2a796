"""Helpers of the event bus tests: polling with a deadline, the commands as real processes, and
reading what the router wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eventbus.keys import STAGE_BASE, JobKeys

BASE_DIR = Path(__file__).resolve().parent.parent.parent
STAGE_OF = {base // 10: stage for stage, base in STAGE_BASE.items()}


def stage_of(seq: int) -> str:
    return STAGE_OF[seq // 10]


def wait_for(predicate, *, timeout: float = 20, interval: float = 0.02, message: str = "condition"):
    """Poll until predicate() is truthy, return its value; fail after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Command:
    """`python manage.py <args>` as a process of its own, its output in a file (never a full pipe)."""

    def __init__(self, *args: str, **env: str):
        self.args = args
        self.log = tempfile.NamedTemporaryFile(prefix="eventbus-cmd-", suffix=".log", delete=False)
        environment = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.test", PYTHONUNBUFFERED="1")
        environment.update(env)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=environment,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        """Cleanup: whatever state the test left it in, end it (SIGCONT first if stopped)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        os.unlink(self.log.name)


def run_command(*args: str, timeout: float = 60, **env: str) -> tuple[int, str]:
    command = Command(*args, **env)
    try:
        code = command.wait(timeout)
        return code, command.output()
    finally:
        command.stop()


def history(client, domain: str, job_id: str, after: int = 0) -> list[dict]:
    """The job's history entries with seq > after, in seq order (as the gateway reads it)."""
    key = JobKeys(domain, job_id).history
    return [json.loads(member) for member in client.zrange(key, f"({after}", "+inf", byscore=True)]


def history_seqs(client, domain: str, job_id: str) -> list[int]:
    return [event["seq"] for event in history(client, domain, job_id)]


def state(client, domain: str, job_id: str) -> dict | None:
    raw = client.get(JobKeys(domain, job_id).state)
    return json.loads(raw) if raw else None


def dead_letters(client, domain: str, shard: int | None = None) -> list[dict]:
    from eventbus.keys import dead_letter_key, shard_count

    shards = range(shard_count(domain)) if shard is None else [shard]
    return [
        {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        for s in shards
        for _id, fields in client.xrange(dead_letter_key(domain, s))
    ]


def pending(client, key: str, group: str = "router") -> int:
    try:
        return client.xpending(key, group)["pending"]
    except Exception as exc:  # no stream or group yet
        if "NOGROUP" in str(exc):
            return 0
        raise


def job_ids_on_shard(domain: str, shard: int, count: int, prefix: str = "job") -> list[str]:
    """Job ids whose keys fall on this shard (to aim entries at one stream)."""
    found, n = [], 0
    while len(found) < count:
        job_id = f"{prefix}-{n}"
        if JobKeys(domain, job_id).shard == shard:
            found.append(job_id)
        n += 1
    return found


class Subscriber:
    """A pub/sub client on every job channel (pattern), subscribed before anything is published."""

    def __init__(self, client, pattern: str = "*:channel:*"):
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(pattern)
        wait_for(
            lambda: self.pubsub.subscribed and client.execute_command("PUBSUB NUMPAT") >= 1,
            message="the pattern subscription",
        )
        self.events: list[dict] = []

    def receive(self, count: int, timeout: float = 20) -> list[dict]:
        """Wait until `count` events in all arrived; return them all."""

        def enough():
            while (message := self.pubsub.get_message(timeout=0.01)) is not None:
                self.events.append(json.loads(message["data"]))
            return len(self.events) >= count

        wait_for(enough, timeout=timeout, interval=0, message=f"{count} published events")
        return self.events

    def drain(self, quiet: float = 0.2) -> list[dict]:
        """Everything that arrives until nothing did for `quiet` seconds."""
        quiet_until = time.monotonic() + quiet
        while time.monotonic() < quiet_until:
            # None also for the (ignored) subscribe confirmation: only data restarts the window.
            message = self.pubsub.get_message(timeout=0.02)
            if message is not None:
                self.events.append(json.loads(message["data"]))
                quiet_until = time.monotonic() + quiet
        return self.events

    def close(self):
        self.pubsub.close()
