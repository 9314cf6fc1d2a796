from idempotency.scope import UserScopeResolver


class HeaderScopeResolver(UserScopeResolver):
    """A principal from a header set by a trusted proxy: resolving it costs no query."""

    def resolve(self, request, view_func):
        principal = request.headers.get("X-Principal")
        return f"{self.tenant(request)}:{principal}" if principal else None


class EmptyScopeResolver(UserScopeResolver):
    """A broken resolver: one scope for everybody."""

    def resolve(self, request, view_func):
        return ""
