"""DRF's JSON parser, with a body nested too deep for Python's parser, or holding a lone
surrogate, refused as any malformed body is (400), not a 500.

Python's json module recurses once per nested array or object: a body a few thousand levels
deep (a few KiB) raises RecursionError, which DRF's parser lets through. The jobs API uses this
parser; put it in your own REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] in place of
"rest_framework.parsers.JSONParser" for your views too.

A lone surrogate (`"\\ud800"`, half of a UTF-16 pair) is valid JSON text but no Unicode
character: Python's parser gives a str that UTF-8 cannot encode, which SQLite stores and every
answer that shows it then fails to encode (a 500 for ever).
"""

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from exactly_once.jsontext import value_is_unicode


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deep.") from None
        if not value_is_unicode(data):
            raise ParseError(
                "JSON parse error - the body holds a lone surrogate (\\ud800 to \\udfff), not Unicode text."
            )
        return data
