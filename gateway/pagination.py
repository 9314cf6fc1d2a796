"""The jobs list's pages: DRF's PageNumberPagination (`count`, `next`, `previous`, `results`),
its query parameters validated: a `page` or `page_size` that is not a positive integer, or a
`page_size` over the maximum, is a 400 problem, not DRF's silent fallback (a page past the end
stays DRF's 404)."""

from __future__ import annotations

import re

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination

from .conf import gateway_settings

POSITIVE = re.compile(r"[1-9][0-9]*")
# Longer numbers are pages past any end (and int() refuses over 4,300 digits).
MAX_DIGITS = 18


class JobPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 100

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return gateway_settings.JOBS_PAGE_SIZE
        if not POSITIVE.fullmatch(raw) or len(raw) > MAX_DIGITS or int(raw) > self.max_page_size:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number from 1 to {self.max_page_size}."]}
            )
        return int(raw)

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param)
        if raw is None:
            return 1
        if raw in self.last_page_strings:
            return paginator.num_pages
        if not POSITIVE.fullmatch(raw):
            raise ValidationError({self.page_query_param: ["A whole number from 1, or 'last'."]})
        if len(raw) > MAX_DIGITS:
            raise NotFound(
                self.invalid_page_message.format(
                    page_number=raw[:20] + "…", message="That page is past the end."
                )
            )
        return int(raw)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["maximum"] = self.max_page_size
        return parameters
