import json
from dataclasses import asdict

from django.core.management.base import BaseCommand, CommandError

from eventbus.jobtypes import UnknownJobType
from eventbus.management.commands._options import domain_list
from eventbus.redis.clients import get_redis, is_cluster
from eventbus.redis.placement import SlotInDispute, balance, is_balanced, placement, spread


class Command(BaseCommand):
    help = (
        "Show where each shard stream lives (its slot and master on a Redis Cluster), its length and "
        "each consumer group's pending entries and lag; --balance moves the shards' slots so that "
        "every master carries an equal share."
    )

    def add_arguments(self, parser):
        parser.add_argument("--domains", help="Comma-separated domains (default all).")
        parser.add_argument(
            "--balance", action="store_true", help="Spread the shards evenly over the masters."
        )
        parser.add_argument("--dry-run", action="store_true", help="With --balance: list the moves only.")
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="One JSON document instead of the table."
        )

    def handle(self, *args, domains, balance: bool, dry_run: bool, as_json: bool, **options):
        client = get_redis()
        names = domain_list(domains)
        try:
            if balance:
                self._balance(client, names, dry_run=dry_run)
            places = placement(client, names)
        except (UnknownJobType, SlotInDispute) as exc:
            raise CommandError(str(exc)) from None
        masters = sorted(node.name for node in client.get_primaries()) if is_cluster(client) else []
        masters = masters or sorted({place.master for place in places})
        if as_json:
            self._json(places, masters)
        else:
            self._table(places, masters)

    def _balance(self, client, names, *, dry_run: bool) -> None:
        if not is_cluster(client):
            raise CommandError(
                "--balance places shards on a Redis Cluster (EVENTBUS['CLUSTER']); this is one server."
            )
        moves = balance(client, names, dry_run=dry_run)
        for move in moves:
            verb = "would move" if dry_run else "moved"
            keys = "" if dry_run else f", {move.keys} key(s)"
            self.stdout.write(f"{verb} {move.stream} (slot {move.slot}) {move.source} -> {move.target}{keys}")
        self.stdout.write(f"{len(moves)} shard(s) {'to move' if dry_run else 'moved'}.\n")

    def _table(self, places, masters) -> None:
        self.stdout.write(f"{'stream':<22} {'slot':>5}  {'master':<22} {'length':>8}  groups (pending, lag)")
        for place in places:
            slot = "-" if place.slot is None else str(place.slot)
            groups = ", ".join(
                f"{g.name} ({g.pending}, {'?' if g.lag is None else g.lag})" for g in place.groups
            )
            self.stdout.write(
                f"{place.stream:<22} {slot:>5}  {place.master:<22} {place.length:>8}  {groups or '-'}"
            )
        self.stdout.write("")
        for master, held in spread(places, masters).items():
            domains = ", ".join(f"{domain} {n}" for domain, n in sorted(held.items()) if domain != "*")
            self.stdout.write(f"{master}: {held['*']} shard(s) ({domains or 'none'})")
        if len(masters) > 1:
            self.stdout.write(
                "balanced"
                if is_balanced(places, masters)
                else "not balanced: run with --balance to spread them"
            )

    def _json(self, places, masters) -> None:
        document = {
            "shards": [asdict(place) for place in places],
            "masters": {master: dict(held) for master, held in spread(places, masters).items()},
            "balanced": is_balanced(places, masters),
        }
        self.stdout.write(json.dumps(document, indent=2))
