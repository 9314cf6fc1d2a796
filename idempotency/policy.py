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
    if policy is None and cls is not None:
        handler_name = (getattr(view_func, "actions", None) or {}).get(method.lower(), method.lower())
        policy = _marked(getattr(cls, handler_name, None)) or _marked(cls)
    if policy is None:
        if idempotency_settings.DEFAULT_POLICY_VIEWS != "all" and not is_api_view(cls):
            return None  # an unmarked admin or HTML view: not covered by default (SPEC §15)
        policy = ViewPolicy(mode=idempotency_settings.DEFAULT_POLICY)
    methods = policy.methods or idempotency_settings.METHODS
    if policy.mode == EXEMPT or method not in methods:
        return None
    return policy
