"""Unknown names said with the known one they were probably meant to be: `idel_timeout_s`
is refused as "did you mean 'idle_timeout_s'?", as Kubernetes' strict field validation and
git's mistyped commands do."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

# Close enough to be a typo (idel/idle, max_concurency), not so loose that every short
# name suggests some other.
CUTOFF = 0.75


def closest(name: str, known: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(name, sorted(known), n=1, cutoff=CUTOFF)
    return found[0] if found else None


def unknown(name: str, known: Iterable[str], what: str = "field") -> str:
    """`unknown field 'idel_timeout_s'; did you mean 'idle_timeout_s'?` (a clause: callers
    prefix where it is, models.yaml's `models[2] (b): unknown key …`)."""
    said = f"unknown {what} {name!r}"
    meant = closest(name, known)
    return f"{said}; did you mean {meant!r}?" if meant else said


def sentence(clause: str) -> str:
    """A clause as a sentence, as /api's field errors are."""
    return clause[:1].upper() + clause[1:] + ("" if clause.endswith(("?", ".")) else ".")
