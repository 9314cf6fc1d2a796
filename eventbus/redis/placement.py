"""Where the bus's shards live on a Redis Cluster, and spreading them evenly over the masters.

Every key of a shard carries its `{domain:shard}` hash tag, so a shard is one slot, and the slot
layout of the cluster decides which master carries it. The usual layout (equal slot ranges,
as `redis-cli --cluster create` makes) does not spread a handful of tags evenly: the default
4 shards of `scan` and `chat` land 2/2/4 on 3 masters, one master carrying half the streams.
`balance()` moves the few slots that need it (CLUSTER SETSLOT and MIGRATE, as `redis-cli
--cluster reshard` does) so that each master carries an equal share of every domain's shards,
and of all of them. The key names stay as the contract writes them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

from eventbus.bus.delivery import streams_for
from eventbus.redis.clients import is_cluster
from eventbus.redis.internals import follow_moved_slots, node_of_slot

logger = logging.getLogger(__name__)

MIGRATE_BATCH = 100  # keys per MIGRATE
MIGRATE_TIMEOUT_MS = 5000
SETTLE_TIMEOUT = 15.0  # seconds for every master to name a moved slot's new owner
CLAIM_AGAIN_AFTER = 1.0  # seconds of disagreement before the target claims the slot again


class SlotInDispute(RuntimeError):
    """A moved slot whose masters still name different owners after SETTLE_TIMEOUT."""


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    pending: int
    lag: int | None  # entries not yet delivered to the group (Redis >= 7; None: unknown)


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    domain: str
    shard: int
    stream: str
    slot: int | None  # None on a single server
    master: str  # host:port
    length: int
    groups: tuple[Group, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Move:
    stream: str
    slot: int
    source: str
    target: str
    keys: int = 0  # keys migrated (0 on a dry run)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _master_of(client, key: str) -> str:
    if is_cluster(client):
        return client.get_node_from_key(key).name
    pool = client.connection_pool
    if getattr(pool, "service_name", None):  # Sentinel: the master it names now
        return f"{pool.service_name} (Sentinel)"
    kwargs = pool.connection_kwargs
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def placement(client, domains=None) -> list[ShardPlacement]:
    """Each shard stream of these domains (default all): its slot, the master that holds it, its
    length and each consumer group's pending count and lag. One round trip per node."""
    streams = streams_for(domains)
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream.key)
        pipe.xinfo_groups(stream.key)
    replies = pipe.execute(raise_on_error=False)
    cluster = is_cluster(client)
    found = []
    for i, stream in enumerate(streams):
        length, groups = replies[2 * i], replies[2 * i + 1]
        found.append(
            ShardPlacement(
                domain=stream.domain,
                shard=stream.shard,
                stream=stream.key,
                slot=client.keyslot(stream.key) if cluster else None,
                master=_master_of(client, stream.key),
                length=length if isinstance(length, int) else 0,
                groups=tuple(
                    Group(
                        _text(g["name"]), int(g["pending"]), None if g.get("lag") is None else int(g["lag"])
                    )
                    for g in (() if isinstance(groups, Exception) else groups)
                ),
            )
        )
    return found


def spread(places: list[ShardPlacement], masters: list[str]) -> dict[str, Counter]:
    """Shards per master, by domain (and "*" for all)."""
    counts: dict[str, Counter] = {master: Counter() for master in masters}
    for place in places:
        counts.setdefault(place.master, Counter())
        counts[place.master][place.domain] += 1
        counts[place.master]["*"] += 1
    return counts


def is_balanced(places: list[ShardPlacement], masters: list[str]) -> bool:
    """Every domain's shards, and all shards, within one of each other across the masters."""
    counts = spread(places, masters)
    for domain in {place.domain for place in places} | {"*"}:
        held = [counts[master][domain] for master in counts]
        if max(held) - min(held) > 1:
            return False
    return True


def plan(places: list[ShardPlacement], masters: list[str]) -> dict[str, str]:
    """Stream key -> the master it should move to: the fewest moves that leave every domain's
    shards within one of each other across the masters, and all shards too (a domain's extra
    shards go to the masters carrying the fewest so far)."""
    load: Counter = Counter({master: 0 for master in masters})
    moves: dict[str, str] = {}
    by_domain: dict[str, list[ShardPlacement]] = {}
    for place in places:
        by_domain.setdefault(place.domain, []).append(place)
    for shards in by_domain.values():
        base, extra = divmod(len(shards), len(masters))
        held = Counter(place.master for place in shards)
        # The extra shards go to the least loaded masters, those already holding more first.
        ranked = sorted(masters, key=lambda m: (load[m], -held[m], m))
        quota = {master: base + (1 if rank < extra else 0) for rank, master in enumerate(ranked)}
        kept: Counter = Counter()
        homeless = []
        for place in shards:
            if place.master in quota and kept[place.master] < quota[place.master]:
                kept[place.master] += 1
            else:
                homeless.append(place)
        for place in homeless:
            target = next(master for master in ranked if kept[master] < quota[master])
            kept[target] += 1
            moves[place.stream] = target
        load.update(kept)
    return moves


def balance(client, domains=None, *, dry_run: bool = False) -> list[Move]:
    """Move the slots of the bus's shards so that they spread evenly over the cluster's masters
    (plan()); nothing when they already do. Keys stay readable throughout: Redis redirects
    (ASK) a key's reader to wherever it is while its slot migrates."""
    if not is_cluster(client):
        raise ValueError("shards are placed on a Redis Cluster; this is a single server")
    nodes = {node.name: node for node in client.get_primaries()}
    places = placement(client, domains)
    targets = plan(places, sorted(nodes))
    moves, moved_slots = [], set()
    for place in places:
        target, slot = targets.get(place.stream), place.slot
        if target is None or slot is None or slot in moved_slots:
            continue
        keys = 0 if dry_run else _migrate_slot(nodes, slot, nodes[place.master], nodes[target])
        moved_slots.add(slot)
        moves.append(Move(place.stream, slot, place.master, target, keys))
        logger.info("shard %s (slot %d): %s -> %s, %d key(s)", place.stream, slot, place.master, target, keys)
    if moves and not dry_run:
        follow_moved_slots(client, moved_slots)  # the new slot map, at once
    return moves


def _node_id(node) -> str:
    return _text(node.redis_connection.execute_command("CLUSTER MYID"))


def move_slot(client, slot: int, target: str) -> int:
    """Move one slot and its keys to the master `target` (host:port), following the Redis
    Cluster specification's live migration; the number of keys moved."""
    nodes = {node.name: node for node in client.get_primaries()}
    source = node_of_slot(client, slot)
    moved = _migrate_slot(nodes, slot, nodes[source.name], nodes[target])
    follow_moved_slots(client, [slot])
    return moved


def _migrate_slot(nodes: dict, slot: int, source, target) -> int:
    src, dst = source.redis_connection, target.redis_connection
    source_id, target_id = _node_id(source), _node_id(target)
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    auth = _migrate_auth(src)
    moved = 0
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, MIGRATE_BATCH):
        src.execute_command(
            "MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS, *auth, "KEYS", *keys
        )
        moved += len(keys)
    # The target first: once it owns the slot, the source's redirects point there.
    for node in [target, source, *(n for n in nodes.values() if n not in (source, target))]:
        try:
            node.redis_connection.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        except ResponseError as exc:  # another master learns it from the cluster bus anyway
            logger.warning("CLUSTER SETSLOT %d NODE on %s: %s", slot, node.name, exc)
    _settle(nodes.values(), slot, target, target_id)
    return moved


def _settle(masters, slot: int, target, target_id: str) -> None:
    """Wait until every master names the target as the slot's owner.

    A master that hears a heartbeat the source sent before its SETSLOT, claiming the slot with a
    higher config epoch than the target's, gives the slot back to the source (the target bumps
    its epoch on taking the slot, but only above the epochs it knows of: not yet all of them
    while the cluster's epochs converge, as right after its creation). The source no longer
    claims it, so nothing mends that: the two redirect to each other for ever (MOVED both ways,
    "TTL exhausted" in clients). The target then takes an epoch above every one it knows now
    (CLUSTER BUMPEPOCH) and claims the slot again, which every master accepts: what
    `redis-cli --cluster fix` does for a slot in dispute."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    claim_at = time.monotonic() + CLAIM_AGAIN_AFTER
    while True:
        owners = {node.name: _owner_in_view(node, slot) for node in masters}
        if all(owner == target_id for owner in owners.values()):
            return
        now = time.monotonic()
        if now > deadline:
            raise SlotInDispute(
                f"slot {slot} moved to {target.name}, but the masters still name different owners after "
                f"{SETTLE_TIMEOUT:g} s: {owners}; check the cluster (redis-cli --cluster check)"
            )
        if now >= claim_at:
            logger.warning(
                "slot %d: the masters disagree on its owner (%s); %s claims it again",
                slot,
                owners,
                target.name,
            )
            target.redis_connection.execute_command("CLUSTER BUMPEPOCH")
            target.redis_connection.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            claim_at = now + CLAIM_AGAIN_AFTER
        time.sleep(0.05)


def _owner_in_view(node, slot: int) -> str | None:
    """The id of the master that owns the slot, as this node sees the cluster."""
    for fields in node.redis_connection.cluster("nodes").values():
        for first, *last in fields["slots"]:
            if int(first) <= slot <= int(last[0] if last else first):
                return fields["node_id"]
    return None


def _migrate_auth(connection) -> list:
    kwargs = connection.connection_pool.connection_kwargs
    password, username = kwargs.get("password"), kwargs.get("username")
    if password and username:
        return ["AUTH2", username, password]
    if password:
        return ["AUTH", password]
    return []
