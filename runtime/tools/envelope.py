"""What a format family's call grammar is made of: `CallGrammar` (the opening, the rest and
its rules) and GBNF string literals."""

from __future__ import annotations

from dataclasses import dataclass


def literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class CallGrammar:
    """The grammar of a format's calls: `rules`, and the expression that follows the opening."""

    opening: str
    rest: str
    rules: str

    def full(self, marker: str = "") -> str:
        """The grammar of a whole answer that is calls, from the format's marker on."""
        head = f"{literal(marker)} tc-ws " if marker else ""
        opening = literal(self.opening) if self.opening else ""
        return f"root ::= {head}{opening} {self.rest}\n{self.rules}\n"

    def after(self, consumed: str) -> str:
        """The grammar for the rest of a call whose first `consumed` characters of the
        opening are written already (a lazily constrained answer)."""
        left = self.opening[len(consumed):]
        head = "tc-ws " if not consumed else ""
        return f"root ::= {head}{literal(left) if left else ''} {self.rest}\n{self.rules}\n"
