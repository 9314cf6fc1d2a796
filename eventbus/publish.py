"""Kept for imports of `eventbus.publish`: publishing lives in eventbus.bus.publish (the bus's
room). The names are also importable from `eventbus` itself."""

from eventbus.bus.publish import Event, InvalidEvent, OutOfOrderEvent, publish_event, publish_events

__all__ = ["Event", "InvalidEvent", "OutOfOrderEvent", "publish_event", "publish_events"]
