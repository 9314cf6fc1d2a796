"""The jobs API's request: a registered job type and the payload its type accepts."""

from rest_framework import serializers

from eventbus.jobtypes import InvalidPayload, UnknownJobType, job_type, registry


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

    def validate(self, attrs):
        try:
            attrs["payload"] = job_type(attrs["domain"])().clean_payload(attrs["payload"])
        except InvalidPayload as exc:
            raise serializers.ValidationError({"payload": exc.errors}) from None
        return attrs
