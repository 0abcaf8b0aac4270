"""Why an operator's action was refused: one exception base for every door.

The admin, /api and manage.py each catch `OperationRefused` alone. A refusal carries the
HTTP status and the OpenAI-style code /api answers with, the field errors when it is about
fields (the admin puts those on its form), and any figures worth showing (`extra`).
"""

from __future__ import annotations

from typing import Any


class OperationRefused(Exception):
    status = 409
    code = "refused"

    def __init__(self, message: str, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}

    def extra(self) -> dict[str, Any]:
        """What /api adds to the answer's `detail` and `code`."""
        return {}


class InvalidConfiguration(OperationRefused):
    """The values do not make a deployment (checks that span fields, clashing names)."""

    status = 400
    code = "invalid"

    def __init__(self, fields: dict[str, list[str]]) -> None:
        lines = [f"{name}: {text}" for name, texts in fields.items() for text in texts]
        super().__init__("; ".join(lines), fields)


class InvalidState(OperationRefused):
    code = "invalid_state"

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state

    def extra(self) -> dict[str, Any]:
        return {} if self.state is None else {"state": self.state}


class CannotSleep(OperationRefused):
    code = "cannot_sleep"


class NotServed(OperationRefused):
    """The deployment's engine does not serve what was asked (its metrics)."""

    status = 404
    code = "not_served"


class EngineDidNotAnswer(OperationRefused):
    """A running engine did not answer a request made on the operator's behalf."""

    status = 502
    code = "engine_unreachable"


class Gone(OperationRefused):
    """The deployment was removed while the action was on its way (a DELETE racing a
    PATCH): the action has nothing left to act on."""

    status = 404
    code = "not_found"

    def __init__(self, pk: Any) -> None:
        super().__init__(f"Deployment {pk} no longer exists.")
