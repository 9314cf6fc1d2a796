"""run_router and run_reclaimer as real processes: two routers in one group, a router killed
with entries in hand, a clean stop on SIGTERM."""

import os
import re
import signal
import urllib.request

import pytest
from django.core.management import CommandError, call_command

from config.redis_server import free_port
from eventbus import publish_events
from eventbus.bus.delivery import streams_for
from eventbus.bus.keys import JobKeys, stream_key
from eventbus.bus.stopping import GracefulStop
from tests.processes import Manage, run_command, wait_for

from .helpers import Subscriber, dead_letters, history, pending, state

SEQS = list(range(10, 25))
JOBS = [("scan", f"s{n}") for n in range(12)] + [("chat", f"c{n}") for n in range(12)]


def stage_for(seq):
    return {1: "vision", 2: "rule"}[seq // 10]


def publish_all(jobs=JOBS, seqs=SEQS):
    """Round after round, one event of every job per batch: jobs interleave in every stream."""
    for seq in seqs:
        publish_events([(domain, job, stage_for(seq), seq, {"seq": seq, "job": job}) for domain, job in jobs])


def all_applied(client, jobs=JOBS, seqs=SEQS):
    return all(client.zcard(JobKeys(domain, job).history) == len(seqs) for domain, job in jobs)


def nothing_pending(client):
    return all(pending(client, stream.key) == 0 for stream in streams_for())


def assert_delivered_once_in_order(client, subscriber, jobs=JOBS, seqs=SEQS):
    received = subscriber.receive(len(jobs) * len(seqs))
    received = subscriber.drain()  # anything more would be a duplicate
    for domain, job in jobs:
        events = history(client, domain, job)
        assert [e["seq"] for e in events] == seqs, job
        assert [e for e in received if e["job_id"] == job] == events, job
        assert state(client, domain, job) == events[-1]
    assert len(received) == len(jobs) * len(seqs)


def blocked_reader(client, consumer):
    """The router's connection, when it waits in XREADGROUP (CLIENT LIST flags b)."""
    for info in client.client_list():
        if (
            info.get("name") == f"run_router:{consumer}"
            and info.get("cmd") == "xreadgroup"
            and "b" in info["flags"]
        ):
            return info
    return None


def stop_while_blocked(client, router):
    """SIGSTOP the router while it waits for entries: Redis still hands it the next ones, which
    it then holds, unacked, for as long as it stays stopped."""
    consumer = router.args[router.args.index("--consumer") + 1]
    for _attempt in range(20):
        wait_for(lambda: blocked_reader(client, consumer), timeout=30, message=f"{consumer} waiting")
        router.signal(signal.SIGSTOP)
        if blocked_reader(client, consumer):
            return
        router.signal(signal.SIGCONT)  # caught between two reads: try again
    raise AssertionError(f"could not stop {consumer} inside a read")


def held_by(client, consumer):
    total = 0
    for stream in streams_for():
        try:
            total += sum(
                c["pending"]
                for c in client.xinfo_consumers(stream.key, "router")
                if c["name"] == consumer.encode()
            )
        except Exception as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc).lower():
                raise
    return total


def applied_by(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(r"^eventbus_applied_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.fixture
def commands():
    started = []

    def start(*args):
        command = Manage(*args).start()
        started.append(command)
        return command

    yield start
    for command in started:  # whatever state a test left it in (stopped, even): end it outright
        command.kill()
        command.log_path.unlink(missing_ok=True)


def test_two_routers_in_one_group_deliver_every_event_once_in_order(redis_client, commands):
    subscriber = Subscriber(redis_client)
    ports = [free_port(), free_port()]
    routers = [
        commands(
            "run_router", "--consumer", name, "--count", "7", "--block-ms", "200", "--metrics-port", str(port)
        )
        for name, port in zip(("a", "b"), ports)
    ]
    for name in ("a", "b"):
        wait_for(
            lambda name=name: blocked_reader(redis_client, name), timeout=30, message=f"router {name} reading"
        )

    publish_all()

    wait_for(lambda: all_applied(redis_client), timeout=60, message="every event applied")
    assert_delivered_once_in_order(redis_client, subscriber)
    wait_for(lambda: nothing_pending(redis_client), message="every entry acked")
    # Both took part, and between them applied each event once.
    counts = [applied_by(port) for port in ports]
    assert all(counts) and sum(counts) == len(JOBS) * len(SEQS), counts
    for router in routers:
        router.signal(signal.SIGTERM)
    assert [router.wait() for router in routers] == [0, 0], [r.log()[-2000:] for r in routers]
    subscriber.close()


def test_entries_of_a_killed_router_are_reclaimed_nothing_lost_or_doubled(redis_client, commands):
    subscriber = Subscriber(redis_client)
    victim = commands("run_router", "--consumer", "victim", "--block-ms", "4000")
    survivor = commands("run_router", "--consumer", "survivor", "--block-ms", "200")
    wait_for(lambda: blocked_reader(redis_client, "survivor"), timeout=30, message="survivor reading")
    stop_while_blocked(redis_client, victim)

    publish_all()
    wait_for(lambda: held_by(redis_client, "victim"), timeout=10, message="entries held by the victim")
    victim.signal(signal.SIGKILL)
    victim.wait()
    assert not all_applied(redis_client)  # the victim's entries, and their successors, wait

    def reclaimed():
        code, output = run_command("run_reclaimer", "--burst", "--min-idle-ms", "100")
        assert code == 0, output
        return all_applied(redis_client)

    wait_for(reclaimed, timeout=60, interval=0.1, message="the reclaimer to re-deliver")
    assert_delivered_once_in_order(redis_client, subscriber)
    wait_for(lambda: nothing_pending(redis_client), message="every entry acked")
    assert dead_letters(redis_client, "scan") == dead_letters(redis_client, "chat") == []
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0
    subscriber.close()


def test_sigterm_finishes_the_batch_in_hand_acks_it_and_exits_0(redis_client, commands):
    router = commands("run_router", "--consumer", "term", "--block-ms", "4000", "--count", "1000")
    stop_while_blocked(redis_client, router)
    publish_all()
    wait_for(lambda: held_by(redis_client, "term"), timeout=10, message="a batch in the router's hands")
    held = held_by(redis_client, "term")

    router.signal(signal.SIGTERM)  # arrives first when it resumes: it stops after this batch
    router.signal(signal.SIGCONT)

    assert router.wait() == 0, router.log()
    assert "stopping after the batch in hand" in router.log()
    assert held_by(redis_client, "term") == 0
    applied = sum(redis_client.zcard(JobKeys(domain, job).history) for domain, job in JOBS)
    assert applied == held  # the batch in hand, and nothing after it
    delivered = sum(
        len(redis_client.xrange(s.key, "-", group["last-delivered-id"]))
        for s in streams_for()
        for group in redis_client.xinfo_groups(s.key)
    )
    assert delivered == held


def test_a_second_signal_forces_the_stop():
    calls, before = [], signal.getsignal(signal.SIGTERM)
    with GracefulStop(lambda: calls.append("stop")) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == ["stop"] and stop.requested
        with pytest.raises(SystemExit) as forced:
            os.kill(os.getpid(), signal.SIGINT)
    assert forced.value.code == 1
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_router_burst_in_process_and_option_errors(redis_client):
    publish_events([("chat", "job-z", "answer", 30, "a")])
    call_command("run_router", burst=True, consumer="inproc", domains="chat", count=10)
    assert [e["seq"] for e in history(redis_client, "chat", "job-z")] == [30]
    assert pending(redis_client, stream_key("chat", JobKeys("chat", "job-z").shard)) == 0
    with pytest.raises(CommandError, match="Unknown domain 'nope'"):
        call_command("run_router", burst=True, domains="scan,nope")


def test_run_reclaimer_stops_on_sigterm_between_passes(redis_client, commands):
    reclaimer = commands("run_reclaimer", "--interval", "60", "--min-idle-ms", "100")
    wait_for(lambda: "entries claimed" in reclaimer.log(), timeout=30, message="a first pass")
    reclaimer.signal(signal.SIGTERM)
    assert reclaimer.wait(timeout=10) == 0, reclaimer.log()
