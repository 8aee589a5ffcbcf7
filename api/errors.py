"""Exception handlers: every error FastAPI sees leaves as problem+json with a stable code."""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Match

from core_log.errors import ErrorCode, LogbusError

from .problems import PROBLEM_JSON, problem_body, problem_bytes

_HTTP_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
}


def problem_response(error: LogbusError) -> Response:
    return Response(problem_bytes(error), error.http_status, media_type=PROBLEM_JSON)


def install(app: FastAPI) -> None:
    @app.exception_handler(LogbusError)
    async def _logbus(_: Request, exc: LogbusError) -> Response:
        return problem_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"])
        error = LogbusError(
            f"{where}: {first['msg']}", code=ErrorCode.INVALID_REQUEST, errors=errors
        )
        return problem_response(error)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        body = problem_body(LogbusError(str(exc.detail), code=code))
        body["status"] = exc.status_code
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return Response(orjson.dumps(body), exc.status_code, headers, media_type=PROBLEM_JSON)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    ]
