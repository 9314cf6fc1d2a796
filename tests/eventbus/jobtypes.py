"""A job type of the test suite's own, written as a user writes one: it logs each stage's work
to the file its payload names, so that tests can count executions across worker processes.
Registered by the test settings (EVENTBUS["JOB_TYPES"])."""

import time
import uuid
from decimal import Decimal
from pathlib import Path

from django.utils import timezone

from eventbus.jobtypes import JobFailed, JobType, Stage
from idempotency.decorators import GLOBAL, idempotent


def log(path: str, line: str) -> None:
    with open(path, "a") as file:
        file.write(line + "\n")


@idempotent(operation="outside-charge", scope=GLOBAL)  # ctx.key: unique per job and stage
def charge(*, amount: int, log_path: str, idempotency_key: str) -> dict:
    """Stands for an outside API that takes an idempotency key (a payment provider's)."""
    log(log_path, f"charge {idempotency_key}")
    return {"charged": amount}


class StagedJob(JobType):
    name = "staged"
    stages = (
        Stage("first", "First"),
        Stage("second", "Second"),
        Stage("third", "Third"),
    )

    def first(self, ctx):
        log(ctx.payload["log"], "first")
        return {"n": 1}

    def second(self, ctx):
        log(ctx.payload["log"], f"second attempt {ctx.attempt} after {ctx.results['first']}")
        if ctx.payload.get("raise"):
            raise ValueError(ctx.payload["raise"])  # a bug, or an outside API's refusal
        ctx.report(done=1, of=2, step="charging")
        receipt = charge(amount=5, log_path=ctx.payload["log"], idempotency_key=ctx.key)
        ctx.report(done=2, of=2, step="charged")
        log(ctx.payload["log"], "second charged")
        hang = ctx.payload.get("hang_on_first_attempt", 0)
        if ctx.attempt == 1 and hang:
            time.sleep(hang)  # the test kills the worker here
        if ctx.payload.get("fail"):
            raise JobFailed("refused by the payload", code=7)
        return {"receipt": receipt}

    def third(self, ctx):
        log(ctx.payload["log"], "third")
        result = {"done": True, "receipt": ctx.results["second"]["receipt"]}
        if "amount" in ctx.payload:  # what a model's DecimalField and DateTimeField hold
            result.update(amount=Decimal(ctx.payload["amount"]), at=timezone.now())
            ctx.report(done=1, of=1, amount=result["amount"], at=result["at"])
        return result

    def outcome(self, results):
        third = results["third"]
        return {"receipt": third["receipt"], **{k: third[k] for k in ("amount", "at") if k in third}}


def lines(path) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []


# An outside API (a payment provider's) that is down for a while, in the bus's Redis so that
# tests see it from the worker's processes: `<api>:failures` more calls fail (ConnectionError,
# as an HTTP client raises on a 503), each call's key is listed in `<api>:calls`, and each key
# is charged at most once in `<api>:charges` (the provider keeps its idempotency keys): the
# charges are the outside effects, one per key that reached a working API.
def flaky_payload(tmp_path, **extra) -> dict:
    """A FlakyJob's payload: its log in `tmp_path`, an outside API of its own."""
    return {"log": str(tmp_path / "log"), "api": f"api-{uuid.uuid4().hex[:8]}", **extra}


def outside_api_down(api: str, failures: int) -> None:
    from eventbus.redis.clients import get_redis

    get_redis().set(f"{api}:failures", failures)


def outside_api_calls(api: str) -> list[str]:
    from eventbus.redis.clients import get_redis

    return [key.decode() for key in get_redis().lrange(f"{api}:calls", 0, -1)]


def outside_api_charges(api: str) -> dict[str, int]:
    from eventbus.redis.clients import get_redis

    return {k.decode(): int(v) for k, v in get_redis().hgetall(f"{api}:charges").items()}


def call_outside_api(api: str, key: str, *, charge_first: bool = False) -> None:
    """`charge_first`: the charge is made and then the answer is lost (the error comes after)."""
    from eventbus.redis.clients import get_redis

    client = get_redis()
    client.rpush(f"{api}:calls", key)
    if charge_first:
        client.hsetnx(f"{api}:charges", key, 1)
    if client.decr(f"{api}:failures") >= 0:
        raise ConnectionError(f"{api} answered 503")
    client.hsetnx(f"{api}:charges", key, 1)  # once per key, as the provider keeps its keys


class FlakyJob(JobType):
    """A payment stage that retries a flaky outside API; a long stage that can be cancelled."""

    name = "flaky"
    stages = (
        Stage("prepare", "Preparing"),
        Stage("pay", "Paying", retries=3, retry_on=(ConnectionError,), backoff=0.05),
        Stage("wait", "Waiting", width=50),
        Stage("finish", "Finishing"),
    )

    def prepare(self, ctx):
        log(ctx.payload["log"], "prepare")
        return {"amount": 5}

    def pay(self, ctx):
        log(ctx.payload["log"], f"pay attempt {ctx.attempt} key {ctx.key}")
        ctx.report(done=0, of=2, step="calling")
        if ctx.payload.get("refuse"):
            raise ValueError("card declined")  # not in retry_on: fails the job at once
        call_outside_api(ctx.payload["api"], ctx.key, charge_first=ctx.payload.get("charge_first", False))
        ctx.report(done=1, of=2, step="paid")
        return {"paid": ctx.results["prepare"]["amount"]}

    def wait(self, ctx):
        """`wait` seconds in steps of 0.1, reporting each: a cancel stops it at its next report."""
        steps = int(ctx.payload.get("wait", 0) * 10)
        for step in range(steps):
            ctx.report(done=step, of=steps)
            time.sleep(0.1)
        return {}

    def finish(self, ctx):
        log(ctx.payload["log"], "finish")
        return {"receipt": f"r-{ctx.key}"}

    def outcome(self, results):
        return {"receipt": results["finish"]["receipt"]}


class PatientFlakyJob(FlakyJob):
    """FlakyJob whose payment retries wait seconds: long enough to see other jobs run meanwhile."""

    name = "flaky_patient"
    stages = (
        Stage("prepare", "Preparing"),
        Stage("pay", "Paying", retries=1, retry_on=(ConnectionError,), backoff=8),
        Stage("wait", "Waiting", width=50),
        Stage("finish", "Finishing"),
    )


class DurableJob(JobType):
    """Durable stages as a user writes them: an atomic stage's ledger line, a sleep, a signal
    and children, each step logged to the payload's `log` (counted by the tests)."""

    name = "durable"
    stages = (
        Stage("pay", "Paying", atomic=True),
        Stage("pause", "Pausing"),
        Stage("review", "Waiting for approval", signals=("approve",)),
        Stage("fan_out", "Running the children"),
    )

    def pay(self, ctx):
        from config.models import LedgerEntry

        LedgerEntry.objects.create(job_id=ctx.job_id, stage="pay", amount=ctx.payload.get("amount", 1))
        log(ctx.payload["log"], "pay")
        if ctx.payload.get("fail_pay_after_write"):
            raise RuntimeError("after the write")
        return {"paid": True}

    def pause(self, ctx):
        log(ctx.payload["log"], "pause-before")
        ctx.sleep(ctx.payload.get("sleep", 0))
        log(ctx.payload["log"], "pause-after")
        return {}

    def review(self, ctx):
        if ctx.payload.get("skip_review"):
            return {"approved": None}
        decision = ctx.wait_for("approve", timeout=ctx.payload.get("review_timeout"))
        log(ctx.payload["log"], f"approved {decision.get('by')}")
        return {"approved": decision.get("by")}

    def fan_out(self, ctx):
        children = ctx.payload.get("children", 0)
        for i in range(children):
            ctx.start_child("staged", {"log": ctx.payload["log"], "i": i})
        ended = ctx.wait_children()
        return {"children": [child["state"] for child in ended]}


# Durable stages on real processes (tests/eventbus/test_atomic_stages.py, test_durable_worker.py).
LEDGER_ROWS = 3


def pause(ctx, point: str) -> None:
    """At the payload's pause point (`pause_at`), the first time it is reached only: write the
    payload's `marker` file and sleep, so that the test kills the worker's process here. A run
    after the kill finds the marker and goes on."""
    if ctx.payload.get("pause_at") != point:
        return
    try:
        with open(ctx.payload["marker"], "x") as marker:
            marker.write(f"{point}: {ctx.stage} attempt {ctx.attempt}\n")
    except FileExistsError:
        return
    time.sleep(ctx.payload.get("pause_seconds", 120))


def wait_for_file(path: str, seconds: float = 120) -> None:
    """Until the test creates `path` (a gate in a stage's code)."""
    deadline = time.monotonic() + seconds
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never came")
        time.sleep(0.05)


class AtomicLedgerJob(JobType):
    """An atomic stage that writes LEDGER_ROWS ledger lines, each reported, between two plain
    stages; the tests kill its worker at the payload's `pause_at`: "before_code" (the end of the
    stage before), "mid_code" (after the first line), "after_writes" (after all of them, before
    the commit) or "after_commit" (the stage after). `fail_after_writes`: the first attempt
    raises after its writes, and the retry waits for the payload's `release` file before its
    own (so that the test counts the rows in between)."""

    name = "atomic_ledger"
    stages = (
        Stage("prepare", "Preparing"),
        Stage("pay", "Paying", atomic=True, retries=1, backoff=0.1),
        Stage("finish", "Finishing"),
    )

    def prepare(self, ctx):
        log(ctx.payload["log"], f"prepare attempt {ctx.attempt}")
        pause(ctx, "before_code")
        return {"rows": LEDGER_ROWS}

    def pay(self, ctx):
        from config.models import LedgerEntry

        log(ctx.payload["log"], f"pay attempt {ctx.attempt}")
        failing = ctx.payload.get("fail_after_writes", False)
        if failing and ctx.attempt > 1:
            wait_for_file(ctx.payload["release"])
        rows = ctx.results["prepare"]["rows"]
        entries = []
        for line in range(rows):
            entries.append(LedgerEntry.objects.create(job_id=ctx.job_id, stage="pay", amount=line + 1).pk)
            ctx.report(done=line + 1, of=rows)
            if line == 0:
                pause(ctx, "mid_code")
        pause(ctx, "after_writes")
        if failing and ctx.attempt == 1:
            raise RuntimeError("failed after its writes")
        return {"entries": entries, "attempt": ctx.attempt}

    def finish(self, ctx):
        log(ctx.payload["log"], f"finish attempt {ctx.attempt}")
        pause(ctx, "after_commit")
        return {"entries": ctx.results["pay"]["entries"]}

    def outcome(self, results):
        return {"entries": results["finish"]["entries"]}


class FanOutJob(JobType):
    """One stage that starts `children` child jobs of the type `child` (their payload
    `child_payload` and their index `i`), then waits for them; `pause_at` "after_children": the
    first run pauses between the starts and the wait."""

    name = "fan_out"
    stages = (Stage("fan_out", "Running the children"),)

    def fan_out(self, ctx):
        count = ctx.payload.get("children", 0)
        for i in range(count):
            ctx.start_child(
                ctx.payload.get("child", "staged"), {**ctx.payload.get("child_payload", {}), "i": i}
            )
        log(ctx.payload["log"], f"started {count}")
        pause(ctx, "after_children")
        return {"children": [{"state": c["state"], "results": c["results"]} for c in ctx.wait_children()]}

    def outcome(self, results):
        return {"children": [child["state"] for child in results["fan_out"]["children"]]}


class RetriedReviewJob(JobType):
    """A signal's wait with a timeout, in a stage retried once (a StageTimeout always is)."""

    name = "review_retried"
    stages = (Stage("review", "Waiting for approval", signals=("approve",), retries=1, backoff=0.1),)

    def review(self, ctx):
        log(ctx.payload["log"], f"review attempt {ctx.attempt}")
        decision = ctx.wait_for("approve", timeout=ctx.payload["timeout"])
        log(ctx.payload["log"], f"approved {decision.get('by')}")
        return {"approved": decision.get("by")}
