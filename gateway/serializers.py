from rest_framework import serializers

DOMAINS = ("scan", "chat")


class JobRequestSerializer(serializers.Serializer):
    domain = serializers.ChoiceField(choices=DOMAINS)
    payload = serializers.DictField(required=False, default=dict)
