"""A job type of the test suite's own, written as a user writes one: it logs each stage's work
to the file its payload names, so that tests can count executions across worker processes.
Registered by the test settings (EVENTBUS["JOB_TYPES"])."""

import time
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
