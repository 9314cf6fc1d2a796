"""Event bus benchmark (not a test): publish events/s, single and batched, next to
redis-benchmark running the same publish.lua by EVALSHA at the same pipeline depth on the same
private server; and router events/s in one process.

    .venv/bin/python bench/eventbus.py [--events 20000] [--batch 50] [--router-events 100000] [--repeat 3]

One client on each side (redis-benchmark -c 1), so the ratio compares the Python path with the
bare protocol cost of the same script. Each measurement runs --repeat times, interleaved with
redis-benchmark's: a publish target is judged on the median of the runs' ratios (each run's
figure over redis-benchmark's next to it). Results are printed and written to
bench/REPORT-eventbus.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.report import load_average, markdown_table, verdict  # noqa: E402
from bench.stats import median, ratio  # noqa: E402
from config.redis_server import RedisServer  # noqa: E402

DATA = {"progress": 0.5, "note": "benchmark event"}


def setup_django(url: str) -> None:
    os.environ["REDIS_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def events(n: int, jobs: int = 1000):
    """n events over `jobs` jobs, each job's seqs increasing (as a worker publishes them)."""
    return [("scan", f"job-{i % jobs}", "vision", 10 + i // jobs, DATA) for i in range(n)]


def bench_single(client, n: int) -> tuple[float, float]:
    """Events/s, and this process's CPU seconds per event (Python and its socket calls)."""
    from eventbus import publish_event

    batch = events(n)
    client.flushall()
    publish_event(*batch[0])  # script loaded, connection open
    cpu = time.process_time()
    start = time.perf_counter()
    published = sum(publish_event(*event) for event in batch[1:])
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    assert published == n - 1, published
    return (n - 1) / elapsed, cpu / (n - 1)


def bench_batched(client, n: int, depth: int) -> float:
    from eventbus import publish_events

    batch = events(n)
    client.flushall()
    publish_events(batch[:1])
    start = time.perf_counter()
    for i in range(1, n, depth):
        publish_events(batch[i : i + depth])
    return (n - 1) / (time.perf_counter() - start)


def redis_benchmark_command(port: int, n: int, depth: int) -> list[str] | None:
    """The same script with the same arguments; every call a new job, so it publishes.

    Each __rand_int__ is replaced by its own random number below -r (an int: at most 2**31-1),
    so two of them side by side make a job id that never repeats in a run; one alone would
    collide a few times in 100,000 calls, and a collision on the last-seq key is an
    OUTOFORDER error reply, which stops redis-benchmark.
    """
    binary = shutil.which("redis-benchmark")
    if not binary and Path("/usr/bin/redis-benchmark").exists():
        binary = "/usr/bin/redis-benchmark"
    if not binary:
        return None
    from eventbus.bus.events import encode_data, event_head
    from eventbus.bus.keys import tag
    from eventbus.bus.scripts import PUBLISH

    t, job = tag("scan", 0), "job-__rand_int____rand_int__"
    data = encode_data(DATA)
    head = event_head(domain="scan", job_id=job, stage="vision", seq=10, data_json=data)
    return [
        binary, "-p", str(port), "-c", "1", "-P", str(depth), "-n", str(n), "-r", "2147483647", "--csv",
        "EVALSHA", PUBLISH.sha, "4",
        f"{t}:published:{job}:vision:10", f"{t}:published-seq:{job}", f"{t}:state:{job}", f"{t}:events",
        "10", "10000", "7200", "3600", job, "scan", "vision", data, head,
    ]  # fmt: skip


def bench_redis_benchmark(client, port: int, n: int, depth: int) -> tuple[float | None, str]:
    command = redis_benchmark_command(port, n, depth)
    if command is None:
        return None, "redis-benchmark not found: column skipped"
    from eventbus.bus.scripts import PUBLISH

    client.flushall()
    client.script_load(PUBLISH.source)
    client.config_resetstat()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"redis-benchmark failed: {result.stdout[-300:]} {result.stderr}")
    # The CSV's test name holds our JSON's quotes unescaped: read the 7 numbers from the end.
    rps = float(result.stdout.strip().splitlines()[-1].rstrip('"').split('","')[-7])
    stats = client.info("commandstats")
    published = stats.get("cmdstat_xadd", {}).get("calls", 0)
    if client.info("errorstats") or published != n:
        raise RuntimeError(f"redis-benchmark published {published} of {n}: {client.info('errorstats')}")
    return rps, " ".join(f"'{c}'" if any(ch in c for ch in ' {}"') else c for c in command)


def redis_cpu(client) -> float:
    """CPU seconds of Redis's main thread (the one that runs commands), INFO cpu."""
    cpu = client.info("cpu")
    return cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]


def bench_router(client, n: int) -> tuple[float, int, float]:
    from django.conf import settings
    from django.test.utils import override_settings

    from eventbus import publish_events
    from eventbus.bus.router import Router

    client.flushall()
    batch = events(n, jobs=2000)
    # Streams long enough to hold the whole backlog: trimmed entries would leave gaps.
    with override_settings(EVENTBUS={**getattr(settings, "EVENTBUS", {}), "STREAM_MAXLEN": 2 * n}):
        for i in range(0, n, 500):
            publish_events(batch[i : i + 500])
        router = Router(burst=True, consumer="bench")
        before = redis_cpu(client)
        start = time.perf_counter()
        router.run()
        elapsed = time.perf_counter() - start
        # Redis's own CPU time in the drain: the ceiling of one router on one Redis here.
        # (Not INFO commandstats' sum: it counts the commands a script calls inside the
        # script's own time a second time.)
        redis_busy = redis_cpu(client) - before
    if client.xpending("{scan:0}:events", "router")["pending"]:
        raise RuntimeError("the router left entries pending")
    histories = sum(1 for _ in client.scan_iter(match="*:history:*", count=1000))
    return n / elapsed, histories, redis_busy / n


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000, help="events per publish measurement")
    parser.add_argument("--batch", type=int, default=50, help="pipeline depth of the batched measurement")
    parser.add_argument("--router-events", type=int, default=100_000)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each measurement, interleaved; a publish target judged on the median ratio",
    )
    parser.add_argument("--report", default=str(BASE_DIR / "bench" / "REPORT-eventbus.md"))
    args = parser.parse_args()

    server = RedisServer().start()
    try:
        setup_django(server.url)
        import redis

        from eventbus.redis.clients import get_redis

        client = redis.Redis.from_url(server.url)
        get_redis()
        version = client.info("server")["redis_version"]
        # Interleaved runs: a shared machine's noise hits both sides of a run's ratio alike.
        runs: dict[str, list] = {"single": [], "batched": [], "rb_single": [], "rb_batched": [], "router": []}
        cpu_single: list[float] = []
        for _ in range(args.repeat):
            rate_single, cpu = bench_single(client, args.events)
            runs["single"].append(rate_single)
            cpu_single.append(cpu)
            runs["rb_single"].append(bench_redis_benchmark(client, server.port, args.events, 1))
            runs["batched"].append(bench_batched(client, args.events * 5, args.batch))
            runs["rb_batched"].append(bench_redis_benchmark(client, server.port, args.events * 5, args.batch))
            runs["router"].append(bench_router(client, args.router_events))
        router_rate, histories, redis_per_event = max(runs["router"])
    finally:
        server.stop()

    def rate(value):
        return f"{value:,.0f}" if value else "skipped"

    def judged(ours: list[float], theirs: list[tuple]) -> tuple[float, float, float, list[float], str]:
        """The run whose ratio is the median (with an odd count; else the median of the ratios
        and of each side): ours, redis-benchmark's, the ratio; every run's ratio; the command."""
        ratios = [ratio(a, b[0] or 0.0) for a, b in zip(ours, theirs)]
        middle = median(ratios)
        if middle in ratios:
            i = ratios.index(middle)
            return ours[i], theirs[i][0] or 0.0, middle, ratios, theirs[i][1]
        return median(ours), median(t[0] or 0.0 for t in theirs), middle, ratios, theirs[0][1]

    # The targets (the README's Measured table): a ratio to redis-benchmark, the median of the
    # runs' ratios; or events/s (the router, its best run).
    single, rb_single, single_ratio, single_ratios, rb_single_cmd = judged(runs["single"], runs["rb_single"])
    batched, rb_batched, batched_ratio, batched_ratios, rb_batched_cmd = judged(
        runs["batched"], runs["rb_batched"]
    )

    def listed(ratios: list[float]) -> str:
        return " / ".join(f"{r:.1%}" for r in ratios)

    rows = [
        (
            "publish, single (depth 1)",
            rate(single),
            rate(rb_single),
            f"{single_ratio:.1%}" if rb_single else "n/a",
            ">= 85%",
            verdict(single_ratio >= 0.85),
        ),
        (
            f"publish, batched (depth {args.batch})",
            rate(batched),
            rate(rb_batched),
            f"{batched_ratio:.1%}" if rb_batched else "n/a",
            ">= 80%",
            verdict(batched_ratio >= 0.80),
        ),
        (
            "router, 1 process (burst drain)",
            rate(router_rate),
            "",
            "",
            ">= 30,000/s",
            verdict(router_rate >= 30_000),
        ),
    ]
    table = markdown_table(
        ("measurement", "eventbus events/s", "redis-benchmark req/s", "ratio", "target", ""), "lrrrll", rows
    )
    print("\n".join(table))
    ceiling = (
        f"Redis itself busy {redis_per_event * 1e6:.1f} us per routed event: at most "
        f"{1 / redis_per_event:,.0f} events/s through one Redis on this machine"
    )
    print(f"(router: {args.router_events:,} events of {histories} jobs; Redis {version}; {ceiling})")
    print(
        f"publish ratios of the {args.repeat} runs: single {listed(single_ratios)}; batched {listed(batched_ratios)}"
    )
    cpu_us = " / ".join(f"{c * 1e6:.1f}" for c in cpu_single)
    print(f"publisher CPU per single publish, us: {cpu_us}")
    for name, *_, target, outcome in rows:
        print(f"{outcome}  {name}: target {target}")
    print(f"load average {load_average()}, nproc {os.cpu_count()}")

    command = " ".join([".venv/bin/python", "bench/eventbus.py", *sys.argv[1:]])

    def rates(values):
        return " / ".join(f"{(v[0] if isinstance(v, tuple) else v) or 0:,.0f}" for v in values)

    all_runs = "; ".join(f"{name} {rates(values)}" for name, values in runs.items())
    report = f"""# Event bus benchmark

Command: `{command}` (one run: each measurement {args.repeat} times, interleaved with
redis-benchmark's; a publish row is the run whose ratio is the median of the runs' ratios, the
router's row its best run; a private redis-server {version} on 127.0.0.1; this machine:
{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; Python {sys.version.split()[0]}).

All runs, events/s: {all_runs}

Ratios of the runs, in order: single {listed(single_ratios)}; batched {listed(batched_ratios)}.
The publisher's CPU per single publish (its Python and socket calls), us: {cpu_us}.

{chr(10).join(table)}

- publish: `eventbus.publish_event` in a loop ({args.events:,} events), and `eventbus.publish_events`
  in batches of {args.batch} ({args.events * 5:,} events), one client; each event a new (job, seq):
  the whole script runs (dedup check, XADD MAXLEN ~, state, dedup key).
- redis-benchmark: the same publish.lua by EVALSHA with the same arguments, `-c 1` (one client, as
  ours), `-P` the same depth, `__rand_int__` in the job id so each call publishes a new event:
  - single: `{rb_single_cmd}`
  - batched: `{rb_batched_cmd}`
- router: {args.router_events:,} events of {histories} jobs pre-published over the 4 scan shards, then
  one `Router(burst=True)` drains them (XREADGROUP COUNT 500 over the shard streams; per batch one
  round trip: the next batch's XREADGROUP, then route.lua calls of up to 50 entries of one stream
  each: state, history, PUBLISH, router dedup key, one XACK; the next batch is parsed while Redis
  runs them). In the best
  run, {ceiling} (CPU time of its main thread over the drain, INFO cpu).
- On a shared machine (see the load average) the runs swing; all of them are listed above.
  A single publish pays, on top of the round trip redis-benchmark pays, the Python side:
  validation, JSON and keys, packing and reading the reply, metrics (the connection is held by
  the thread, not checked out per call; with the OpenTelemetry API installed and no provider
  set, the publish span is not made current: its traceparent alone is carried). Batches spread
  that over the pipeline.
"""
    Path(args.report).write_text(report)
    print(f"written to {args.report}")


if __name__ == "__main__":
    main()
