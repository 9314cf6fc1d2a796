"""The jobs benchmark's two baselines, their Django side (bench/jobs.py; URLconf of
bench/jobs_settings.py when BENCH_JOBS_SYSTEM is not `ours`).

Baseline (a), "Celery + Channels", what a team builds without the toolkit:

    POST /bench/channels/jobs/       a DRF view (token auth, the body validated) that enqueues the
                                     Celery task `bench.channels_job` and answers 201: no
                                     idempotency, the Idempotency-Key only names the job
    ws /ws/bench/channels/<job_id>/  a Channels consumer (session auth) that joins the group
                                     `job-<job_id>` and forwards whatever the group gets

  The task runs the four stages (bench/jobs_stages.py) and after each sends the stage's frame
  with `async_to_sync(channel_layer.group_send)` on Channels' Redis channel layer, then the
  final frame. Nothing is stored: a socket that joins the group late misses what was sent
  before, a task run twice sends everything twice.

Baseline (b), DBOS Transact (its workflow and worker processes: bench/jobs_dbos.py):

    POST /bench/dbos/jobs/           a DRF view (token auth, the body validated) that enqueues
                                     the workflow through a DBOSClient, with the job's
                                     Idempotency-Key as its workflow id, and answers 201
    ws /ws/bench/dbos/<job_id>/      a Channels consumer (session auth) that reads the
                                     workflow's stream (DBOSClient.read_stream_async) from its
                                     start and forwards each value, to the stream's end

A job's id is `u<user pk>-<Idempotency-Key>` in both: a user's own (the consumers refuse other
ids), and known to a client before it POSTs (baseline (a)'s client opens its socket first).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from typing import Any

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.urls import path, re_path
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from bench.jobs_stages import (
    DBOS_QUEUE,
    DBOS_STREAM,
    DBOS_WORKFLOW,
    STAGES,
    final_frame,
    progress_frame,
    work,
)

KEY = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")  # the bench's keys; a job id must be a group name too
NOT_LOGGED_IN, NOT_FOUND = 4401, 4404


class JobRequest(serializers.Serializer):
    domain = serializers.CharField()
    payload = serializers.DictField()


class BaselineJobView(APIView):
    permission_classes = [IsAuthenticated]

    def post(self, request):
        key = request.headers.get("Idempotency-Key", "")
        if not KEY.match(key):
            return Response({"detail": "Idempotency-Key: 1-80 of A-Z a-z 0-9 _ . -"}, status=400)
        body = JobRequest(data=request.data)
        body.is_valid(raise_exception=True)
        job_id = f"u{request.user.pk}-{key}"
        self.start(job_id, key, body.validated_data["payload"])
        return Response(
            {"job_id": job_id, "domain": body.validated_data["domain"]}, status=status.HTTP_201_CREATED
        )

    def start(self, job_id: str, key: str, payload: dict) -> None:
        raise NotImplementedError


def owns(scope, job_id: str) -> bool:
    user = scope.get("user")
    return bool(user is not None and user.is_authenticated and job_id.startswith(f"u{user.pk}-"))


# --- baseline (a): Celery + Channels ---------------------------------------------------------


@shared_task(name="bench.channels_job")
def channels_job(job_id: str, key: str, payload: dict) -> None:
    send = async_to_sync(get_channel_layer().group_send)
    group = f"job-{job_id}"
    for index, stage in enumerate(STAGES):
        work(key, stage)
        send(group, {"type": "job.frame", "text": json.dumps(progress_frame(job_id, index))})
    send(group, {"type": "job.frame", "text": json.dumps(final_frame(job_id))})


class ChannelsJobView(BaselineJobView):
    def start(self, job_id: str, key: str, payload: dict) -> None:
        channels_job.delay(job_id, key, payload)


class ChannelsJobConsumer(AsyncWebsocketConsumer):
    group: str | None = None

    async def connect(self):
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        if not owns(self.scope, job_id):
            await self.close(code=NOT_FOUND)
            return
        self.group = f"job-{job_id}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def job_frame(self, event):
        await self.send(text_data=event["text"])


# --- baseline (b): DBOS Transact ----------------------------------------------------------------

_client: Any = None
_client_lock = threading.Lock()


def dbos_client():
    """The process's DBOSClient (its notification listener wakes stream readers, as DBOS's own
    processes are woken: LISTEN/NOTIFY)."""
    global _client
    with _client_lock:
        if _client is None:
            from dbos import DBOSClient

            from bench.jobs_dbos import APP_NAME

            _client = DBOSClient(
                system_database_url=os.environ["BENCH_DBOS_URL"],
                use_listen_notify=True,
                application_name=APP_NAME,
                system_database_pool_size=int(os.environ.get("BENCH_DBOS_POOL", 10)),
                # Paused (SIGSTOP) while another system is measured: see bench/jobs_dbos.py.
                sys_db_idle_transaction_timeout_sec=0,
            )
        return _client


class DbosJobView(BaselineJobView):
    def start(self, job_id: str, key: str, payload: dict) -> None:
        # The workflow id is SetWorkflowID's, given to the client: enqueued again under the same
        # id, DBOS returns the workflow it has (workflow_id_reuse_policy "return-existing").
        options = {"workflow_name": DBOS_WORKFLOW, "queue_name": DBOS_QUEUE, "workflow_id": job_id}
        dbos_client().enqueue(options, key, payload)


class DbosJobConsumer(AsyncWebsocketConsumer):
    reader: asyncio.Task | None = None

    async def connect(self):
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        if not owns(self.scope, job_id):
            await self.close(code=NOT_FOUND)
            return
        await self.accept()
        self.reader = asyncio.create_task(self.forward(job_id))

    async def forward(self, job_id: str) -> None:
        client = await asyncio.to_thread(dbos_client)
        async for value in client.read_stream_async(job_id, DBOS_STREAM):
            await self.send(text_data=json.dumps(value))
        await self.close()

    async def disconnect(self, code):
        if self.reader is not None:
            self.reader.cancel()


urlpatterns = [
    path("bench/channels/jobs/", ChannelsJobView.as_view()),
    path("bench/dbos/jobs/", DbosJobView.as_view()),
]

websocket_urlpatterns = [
    re_path(r"^ws/bench/channels/(?P<job_id>[A-Za-z0-9_.-]+)/$", ChannelsJobConsumer.as_asgi()),
    re_path(r"^ws/bench/dbos/(?P<job_id>[A-Za-z0-9_.-]+)/$", DbosJobConsumer.as_asgi()),
]
