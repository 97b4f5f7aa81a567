"""llama.cpp's JSON grammars, from llama-cpp-python's converter (runtime/grammar/__init__.py uses them)."""

from __future__ import annotations


def json_grammar() -> str:
    """llama.cpp's grammar for any JSON object."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema_json: str) -> str:
    """A grammar accepting exactly the JSON documents a schema allows (llama.cpp's converter)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    # The converter's string characters admit raw control characters, which JSON forbids
    # (an answer with a raw newline in a string would not parse): exclude them, as
    # llama.cpp's own JSON grammar does.
    return json_schema_to_gbnf(schema_json).replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]')
