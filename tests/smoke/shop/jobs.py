"""Job types of the project's own, declared with the toolkit's public API and registered by
@register (eventbus imports every installed app's `jobs` module at startup): Greet, and
Checkout, which operating jobs (a stage retried, a cancel, a job retried) is checked with."""

import time
from pathlib import Path

from eventbus.jobtypes import JobType, Stage, register


@register
class Greet(JobType):
    name = "greet"
    stages = (Stage("prepare", "Preparing"), Stage("write", "Writing"))

    def prepare(self, ctx):
        return {"who": ctx.payload.get("who", "world")}

    def write(self, ctx):
        for i in range(3):
            ctx.report(done=i + 1, of=3, text=f"part {i}")
        return {"text": "hello " + ctx.results["prepare"]["who"]}

    def outcome(self, results):
        return {"text": results["write"]["text"]}


# The outside world of Checkout is files in the payload's `dir`, not this process's memory: the
# worker that runs the stages is another process than the smoke test that sets it up and checks
# it. `pay-failures`: how many more payment calls fail (a 503); `pay-calls`: each call's key;
# `broken`: shipping fails while it exists; `runs`: each stage run, with its ctx.key.
def log_run(ctx) -> Path:
    directory = Path(ctx.payload["dir"])
    with open(directory / "runs", "a") as runs:
        runs.write(f"{ctx.stage} {ctx.key}\n")
    return directory


def bank_pay(directory: Path, idempotency_key: str) -> str:
    """Stands for a payment provider's API: it fails while `pay-failures` says so."""
    with open(directory / "pay-calls", "a") as calls:
        calls.write(idempotency_key + "\n")
    failures = directory / "pay-failures"
    left = int(failures.read_text()) if failures.exists() else 0
    if left > 0:
        failures.write_text(str(left - 1))
        raise ConnectionError("the bank answered 503")
    return f"receipt-{idempotency_key}"


@register
class Checkout(JobType):
    """A payment retried on a 503, a wait that a cancel stops, and a shipping stage that fails
    while the warehouse is closed (the job is then retried once it opens)."""

    name = "checkout"
    stages = (
        Stage("prepare", "Preparing"),
        Stage("pay", "Paying", retries=2, retry_on=(ConnectionError,), backoff=0.1),
        Stage("wait", "Waiting for stock"),
        Stage("ship", "Shipping"),
    )

    def prepare(self, ctx):
        log_run(ctx)
        return {"amount": 5}

    def pay(self, ctx):
        directory = log_run(ctx)
        ctx.report(done=0, of=1, text="calling the bank")  # again on a retry: the bus drops the copy
        return {"receipt": bank_pay(directory, ctx.key)}

    def wait(self, ctx):
        """`wait` seconds, stopped early by a cancel (ctx.check() raises JobCancelled)."""
        log_run(ctx)
        ctx.report(done=0, of=1, text="waiting")
        until = time.monotonic() + float(ctx.payload.get("wait", 0))
        while time.monotonic() < until:
            ctx.check()
            time.sleep(0.05)
        return {}

    def ship(self, ctx):
        directory = log_run(ctx)
        if (directory / "broken").exists():
            raise ValueError("the warehouse is closed")
        return {"shipped": True}

    def outcome(self, results):
        return {"receipt": results["pay"]["receipt"]}
