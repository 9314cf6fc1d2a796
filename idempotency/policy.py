"""Per-view policy: required, optional or exempt, and how a view's key is held."""

from __future__ import annotations

from dataclasses import dataclass

from .conf import idempotency_settings

REQUIRED, OPTIONAL, EXEMPT = "required", "optional", "exempt"
MODES = (REQUIRED, OPTIONAL, EXEMPT)
ATTRIBUTE = "idempotency_policy"


@dataclass(frozen=True, slots=True)
class ViewPolicy:
    mode: str
    lease_seconds: int | None = None
    ttl_seconds: int | None = None
    # Run the view in a transaction that also stores its answer (ATOMIC_REQUESTS does the same).
    atomic: bool = False
    methods: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Idempotency policy must be one of {MODES}, not {self.mode!r}")


def is_api_view(cls) -> bool:
    """A DRF view class (as_view() of APIView, a ViewSet or @api_view records it as `cls`)."""
    from rest_framework.views import APIView

    return isinstance(cls, type) and issubclass(cls, APIView)


def _marked(obj):
    return getattr(obj, ATTRIBUTE, None)


def policy_for(view_func, method: str) -> ViewPolicy | None:
    """The policy that covers this request, or None when it is not covered."""
    policy = _marked(view_func)
    cls = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
    if cls is not None:
        actions = getattr(view_func, "actions", None)
        handler_name = actions.get(method.lower()) if actions is not None else method.lower()
        handler = getattr(cls, handler_name, None) if handler_name else None
        if handler is None:
            # A method the view has no handler for: it answers 405 itself, and the key neither
            # replays another method's answer nor keeps that 405.
            return None
        policy = policy or _marked(handler) or _marked(cls)
    if policy is None:
        if idempotency_settings.DEFAULT_POLICY_VIEWS != "all" and not is_api_view(cls):
            return None  # an unmarked admin or HTML view: not covered by default (howto/idempotent-views.md)
        policy = ViewPolicy(mode=idempotency_settings.DEFAULT_POLICY)
    methods = policy.methods or idempotency_settings.METHODS
    if policy.mode == EXEMPT or method not in methods:
        return None
    return policy
