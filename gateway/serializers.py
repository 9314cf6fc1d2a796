"""The jobs API's request: a registered job type and the payload its type accepts.

A payload is refused (400) when it nests deeper than GATEWAY["PAYLOAD_MAX_DEPTH"] or holds a
NUL character in a key or a string: PostgreSQL's jsonb cannot store one (a 500 there, a 201 on
SQLite), so no database gets one.
"""

from rest_framework import serializers

from eventbus.jobtypes import UnknownJobType, job_type, registry

from .conf import gateway_settings

NUL = "\x00"


def payload_problem(payload, max_depth: int) -> str | None:
    """Why the payload cannot be stored alike on every database, or None. Walked with a stack,
    not recursion: the payload may be as deep as the parser allowed."""
    stack = [(payload, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            if isinstance(value, str) and NUL in value:
                return f"A string holds a NUL character (\\u0000), at {path or '/'}."
            continue
        if depth > max_depth:
            return f"The payload is nested deeper than {max_depth} levels, at {path or '/'}."
        for key, item in items:
            if isinstance(key, str) and NUL in key:
                return f"A key holds a NUL character (\\u0000), in {path or '/'}."
            stack.append((item, depth + 1, f"{path}/{key}"))
    return None


class JobRequestSerializer(serializers.Serializer):
    domain = serializers.CharField(max_length=32)
    payload = serializers.DictField(required=False, default=dict)

    def validate_domain(self, value):
        try:
            job_type(value)
        except UnknownJobType:
            raise serializers.ValidationError(
                f"Not a job type: choose one of {sorted(registry())}."
            ) from None
        return value

    def validate_payload(self, value):
        problem = payload_problem(value, gateway_settings.PAYLOAD_MAX_DEPTH)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    # The type's clean_payload runs in eventbus.start_job, which the view calls.
