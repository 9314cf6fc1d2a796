"""The event bus's models: the job (Job, its states, its stages' records) and the dead letters'
stand-in for the admin.

A Job is accepted once per (scope, Idempotency-Key) by idempotency's generic accept-once
(idempotency.services.accept_once, used by eventbus.services), changes state only in
eventbus.job.lifecycle, and is read through eventbus.selectors.
"""

import uuid

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone


class Job(models.Model):
    """An accepted job: exactly one per (scope, Idempotency-Key). Its run (eventbus.job.runs) works
    through the stages its type (`domain`) declares, recorded in StageRecord."""

    class State(models.TextChoices):
        PENDING = "PENDING"
        RUNNING = "RUNNING"
        # A stage waits (ctx.sleep, ctx.wait_for, ctx.wait_children) and no run holds a worker:
        # the sweeper or the awaited signal or child wakes it (run_after: when, if known).
        WAITING = "WAITING"
        COMPLETED = "COMPLETED"
        FAILED = "FAILED"
        TIMED_OUT = "TIMED_OUT"
        CANCELLED = "CANCELLED"

    # Not ended yet: what the running cap counts and the recovery watches.
    UNFINISHED_STATES = (State.PENDING, State.RUNNING, State.WAITING)
    # What a run may start (-> RUNNING): a job not started yet, or one whose stage waited.
    STARTABLE_STATES = (State.PENDING, State.WAITING)
    # Never left once reached (eventbus.job.lifecycle): the job has ended.
    FINAL_STATES = (State.COMPLETED, State.FAILED, State.TIMED_OUT, State.CANCELLED)
    # What retry_job takes: the jobs that did not complete.
    RETRYABLE_STATES = (State.FAILED, State.TIMED_OUT, State.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scope = models.CharField(max_length=255)
    idem_key = models.CharField(max_length=255)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs"
    )
    # The job's type (JobType.name, registered in eventbus.jobtypes). "Job type" is the term in
    # the code; the wire keeps `domain`: this column, the jobs API's field, events' fields and
    # Redis key texts (its streams' {domain:shard} tag), which stored data and clients depend on.
    domain = models.CharField(max_length=32)
    event_type = models.CharField(max_length=64)
    biz_key = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    payload = models.JSONField(default=dict, blank=True)
    accepted_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    # The job this one retries (eventbus.retry_job): it reuses that job's finished stages, and
    # its stages' keys are those of the first job of the chain. A job has at most one retry
    # (the constraint job_one_retry): two would run its unfinished stages twice.
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    # eventbus.cancel_job asked the running job to stop; its run ends it CANCELLED.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # The job whose stage started this one (ctx.start_child): cancelling the parent cancels it,
    # and its end may wake the parent (ctx.wait_children).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    # When its first run started it (PENDING -> RUNNING).
    started_at = models.DateTimeField(null=True, blank=True)
    # A delayed start (start_job(run_after=...), a task's run_after): the job stays PENDING, its
    # run not sent, until then; the sweep sends it once due (eventbus.job.sweep.enqueue_due).
    # Kept with the job, never a broker ETA: it survives restarts of every process and of Redis.
    # For a WAITING job: when it resumes (a sleep's end, a signal's timeout; None: when woken).
    run_after = models.DateTimeField(null=True, blank=True)
    # The Celery queue its run is sent to ("": the Celery app's default queue) and its priority
    # there (-100..100, higher first), as a django.tasks task asks (eventbus.backends).
    queue = models.CharField(max_length=64, blank=True, default="")
    priority = models.SmallIntegerField(default=0)
    # The W3C trace context of the span that accepted it (exactly_once.tracing): its run joins that
    # trace. Empty without tracing.
    trace_context = models.CharField(max_length=512, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "idem_key"], name="job_scope_idem_key"),
            models.UniqueConstraint(
                fields=["retry_of"], condition=models.Q(retry_of__isnull=False), name="job_one_retry"
            ),
        ]
        indexes = [
            models.Index(fields=["owner", "-accepted_at"], name="job_owner_accepted_at"),
            models.Index(fields=["state", "enqueued_at"], name="job_state_enqueued_at"),
            models.Index(
                fields=["run_after"],
                condition=models.Q(
                    state__in=["PENDING", "WAITING"], enqueued_at__isnull=True, run_after__isnull=False
                ),
                name="job_delayed_start",
            ),
        ]

    def __str__(self):
        return f"{self.domain} {self.id} ({self.state})"

    @property
    def ended(self) -> bool:
        """In one of FINAL_STATES, never left: the one test of a job's end, wherever it is asked."""
        return self.state in self.FINAL_STATES


# A stage's states, as StageRecord.state names them; PENDING is a declared stage with no record.
STAGE_STATES = ("PENDING", "RUNNING", "WAITING", "RETRYING", "COMPLETED", "FAILED", "CANCELLED")
# The error_type a run records on the stage a cancel stopped (eventbus.jobtypes.JobCancelled).
CANCELLED_ERROR = "JobCancelled"


class StageRecord(models.Model):
    """One stage of one job: how many runs started it and, once it finished, its result and
    the events it reported. A re-run of the job skips a finished stage and reuses these."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="stage_records")
    stage = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField(default=0, help_text="runs that started this stage")
    # The stage's result in its JSON form (eventbus.job.stages.recorded).
    result = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    # [[stage, seq, data], ...] in the order they were published (data as the bus encodes it).
    events = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last failure of an attempt of the stage (eventbus.job.stages.describe), until an attempt
    # finishes it: its type and message are the job's error as its owner sees it; the traceback
    # is for staff (the admin).
    error_type = models.CharField(max_length=200, null=True, blank=True)
    # The exception's class path (`module.QualName`), as django.tasks' TaskError names it.
    error_class = models.CharField(max_length=255, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    error_traceback = models.TextField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    # A failed attempt whose retry waits (Stage.retries): when it is due. Cleared when the
    # attempt starts. The recovery leaves a job alone while it waits.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Who ran each attempt ("<host>:<pid>" of the worker process), oldest first: one per attempt,
    # as django.tasks' TaskResult.worker_ids.
    workers = models.JSONField(default=list, blank=True)
    # The stage's durable waits, by the order its code asks for them (ctx.sleep's due times,
    # ctx.wait_for's timeouts): a new attempt of the stage finds a wait it asked for before and
    # does not start it again. And what it waits for now ("sleep", "signal:<name>",
    # "children"; None: nothing), until an attempt goes past it.
    waits = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    waiting_for = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "stage"], name="stage_record_job_stage")]

    def __str__(self):
        if self.finished_at:
            status = "finished"
        elif self.error_type:
            status = "cancelled" if self.error_type == CANCELLED_ERROR else "failed"
        else:
            status = "in flight"
        return f"{self.job_id} {self.stage} ({status})"

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def state(self) -> str:
        """COMPLETED, WAITING (ctx.sleep, wait_for, wait_children: no attempt runs meanwhile),
        RETRYING (a failed attempt's retry waits), CANCELLED (a cancel stopped it:
        error_type JobCancelled), FAILED (its last attempt failed) or RUNNING; a declared stage
        with no record is PENDING. Every reader of a stage's state (the jobs API, the admin)
        reads it here."""
        if self.finished_at is not None:
            return "COMPLETED"
        if self.waiting_for is not None:
            return "WAITING"
        if self.next_attempt_at is not None:
            return "RETRYING"
        if self.failed_at is not None and self.failed_at >= self.started_at:
            return "CANCELLED" if self.error_type == CANCELLED_ERROR else "FAILED"
        return "RUNNING"


class JobSignal(models.Model):
    """A signal sent to a job (eventbus.signal_job, POST /api/jobs/<id>/signals/<name>/, the
    admin): one per (job, name), kept until a stage's ctx.wait_for(name) takes its payload, even
    when it was sent before the stage waited. Sent again with its key, it is the same signal;
    with another key, refused (SignalAlreadySent)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    idem_key = models.CharField(max_length=255)
    sent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sent_at = models.DateTimeField(default=timezone.now)
    # When a stage's wait_for took it (None: not yet).
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="job_signal_once")]

    def __str__(self):
        return f"{self.job_id} {self.name}"


class DeadLetter(models.Model):
    """No table: dead letters are entries of Redis streams (`{domain:shard}:dead`, read by
    eventbus.bus.redrive). The model exists for the admin (eventbus.admin lists them) and for its
    permissions, which migrate creates as for any model: `view_deadletter` shows them, and
    `redrive_deadletter` puts them back on their streams. Never query it."""

    class Meta:
        managed = False
        default_permissions = ("view",)  # nobody adds, edits or deletes one through Django
        permissions = [("redrive_deadletter", "Can re-drive dead letters to their streams")]
        verbose_name = "dead letter"
