"""Is the bus's Redis a durable store? Checked by each long-running process as it starts.

The bus keeps its exactly-once state in Redis (dedup keys, applied seqs, streams). A server
that evicts keys under memory pressure drops a dedup key and lets a duplicate through without a
word; a server without persistence forgets everything on restart. The processes read the live
server's settings and warn loudly, or refuse to start, by EVENTBUS["REDIS_DURABILITY"]:
"warn" (default), "refuse", or "ignore".
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError, ResponseError

from eventbus.conf import eventbus_settings

logger = logging.getLogger(__name__)

SAFE_EVICTION = "noeviction"


def durability_problems(client) -> list[str]:
    """What makes this server unsafe for the bus, in words; [] when nothing does."""
    try:
        config = {}
        for name in ("appendonly", "save", "maxmemory-policy"):
            config.update(client.config_get(name))
    except ResponseError:
        # CONFIG is disabled (managed services rename it): nothing can be read, nothing is claimed.
        return ["CONFIG GET is not allowed on this server, so its persistence and eviction cannot be checked"]
    problems = []
    if config.get("appendonly") != "yes" and not config.get("save"):
        problems.append(
            "persistence is off (appendonly no, no save points): a restart loses every "
            "dedup key, stream and job state"
        )
    elif config.get("appendonly") != "yes":
        problems.append(
            "only RDB snapshots persist (appendonly no): a restart loses the writes since the last snapshot"
        )
    policy = config.get("maxmemory-policy")
    if policy is not None and policy != SAFE_EVICTION:
        problems.append(
            f"maxmemory-policy is {policy}: an evicted dedup key lets a duplicate through "
            f"silently; set it to {SAFE_EVICTION}"
        )
    return problems


MIN_CLUSTER_VERSION = (7, 0)  # SPUBLISH / SSUBSCRIBE


def too_old_for_cluster(infos: dict) -> list[str]:
    """The masters (INFO server by node name) too old for the bus on a Redis Cluster."""
    old = []
    for name, info in sorted(infos.items()):
        version = str(info.get("redis_version", "0"))
        if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) < MIN_CLUSTER_VERSION:
            old.append(f"{name} runs Redis {version}")
    return old


def check_cluster_version(client, *, process: str) -> None:
    """On a Redis Cluster the router publishes with SPUBLISH and the gateway listens with
    SSUBSCRIBE (sharded pub/sub, Redis >= 7): refuse to start on an older master, whatever
    REDIS_DURABILITY says, rather than fail at the first event."""
    from redis.cluster import RedisCluster

    try:
        infos = client.info("server", target_nodes=RedisCluster.PRIMARIES)
    except RedisError as exc:
        logger.warning("%s: could not read the cluster's Redis versions: %s", process, exc)
        return
    if "redis_version" in infos:  # a one-master cluster answers for itself
        infos = {"master": infos}
    old = too_old_for_cluster(infos)
    if old:
        refusal = (
            f"{process}: the event bus on a Redis Cluster needs Redis >= 7.0 on every master "
            f"(sharded pub/sub: SPUBLISH, SSUBSCRIBE); " + ", ".join(old) + "."
        )
        logger.error("%s", refusal)
        raise ImproperlyConfigured(refusal)


def check_durability(client, *, process: str) -> list[str]:
    """Warn, refuse (ImproperlyConfigured) or say nothing about an unsafe server, by setting.
    On a Redis Cluster, first the masters' version (check_cluster_version)."""
    if eventbus_settings.CLUSTER:
        check_cluster_version(client, process=process)
    mode = eventbus_settings.REDIS_DURABILITY
    if mode == "ignore":
        return []
    if mode not in ("warn", "refuse"):
        raise ImproperlyConfigured(
            f'EVENTBUS["REDIS_DURABILITY"] is "warn", "refuse" or "ignore", not {mode!r}.'
        )
    try:
        problems = durability_problems(client)
    except RedisError as exc:  # unreachable now: the process finds out soon enough, and retries
        logger.warning("%s: could not check Redis durability: %s", process, exc)
        return []
    if problems and mode == "refuse":
        refusal = (
            f"{process}: Redis is not safe for the event bus: "
            + "; ".join(problems)
            + ' (EVENTBUS["REDIS_DURABILITY"] is "refuse").'
        )
        logger.error("%s", refusal)
        raise ImproperlyConfigured(refusal)
    for problem in problems:
        logger.warning("%s: REDIS IS NOT SAFE FOR THE EVENT BUS: %s", process, problem)
    return problems
