"""OpenAI-shaped errors: {"error": {"message", "type", "code"}}."""

from __future__ import annotations

import json

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
}


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.code, self.param)


def error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    error = {"message": message, "type": TYPES.get(status, "server_error"), "code": code}
    if param is not None:
        error["param"] = param
    return json.dumps({"error": error}).encode()
