"""DRF's JSON parser, with a body nested too deep for Python's parser refused as any malformed
body is (400), not a 500.

Python's json module recurses once per nested array or object: a body a few thousand levels
deep (a few KiB) raises RecursionError, which DRF's parser lets through. The jobs API uses this
parser; put it in your own REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] in place of
"rest_framework.parsers.JSONParser" for your views too.
"""

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deep.") from None
