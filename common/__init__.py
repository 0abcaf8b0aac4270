"""Shared helpers that import no app of Modelship."""
