"""The ASGI application: the OpenAI and Anthropic routers, /health, the optional API key, and
errors in the shape of the API each endpoint belongs to.

    app = create_app(DaemonLink.open(client), GatewayConfig())

Paths under /v1/messages answer errors in Anthropic's shape, every other path in OpenAI's.
FastAPI's 422 for a body that does not validate is answered as a 400 naming the parameter, and
/openapi.json documents those 400s (not 422s), so the schema says what the server does.
"""
from __future__ import annotations

import logging
import secrets
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import anthropic_api, openai_api
from .anthropic_schemas import UNSUPPORTED_HINTS as ANTHROPIC_HINTS
from .body_limit import BodyLimit
from .config import GatewayConfig
from .daemon_link import ClientGone, DaemonLink
from .errors import ApiError, anthropic_error_body, openai_error_body, validation_message
from .openai_schemas import UNSUPPORTED_HINTS as OPENAI_HINTS

__all__ = ["create_app"]

log = logging.getLogger("flashd.http")

ANTHROPIC_PREFIX = "/v1/messages"
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request": nobody reads it, the log does


def _version() -> str:
    try:
        return version("flashd")
    except PackageNotFoundError:
        return "0"


# -- error bodies, for the OpenAPI document ------------------------------------------------------

class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


def _error_responses(model: type[BaseModel]) -> dict:
    return {
        200: {"content": {"application/json": {}, "text/event-stream": {}},
              "description": "The result; with stream=true, server-sent events."},
        400: {"model": model, "description": "Malformed JSON, a wrong type, an unknown or unsupported parameter, or a prompt too long for the context."},
        401: {"model": model, "description": "The API key is missing or wrong (only when the gateway has one)."},
        404: {"model": model, "description": "No such model."},
        413: {"model": model, "description": "The request body exceeds the gateway's --max-body-bytes."},
        500: {"model": model, "description": "A bug in flashd."},
        503: {"model": model, "description": "The daemon is unreachable, overloaded, or its model is parked."},
    }


# -- API key ---------------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY (OpenAI clients)")
_x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="x-api-key: KEY (Anthropic clients)")


async def check_api_key(request: Request,
                        bearer: HTTPAuthorizationCredentials | None = Security(_bearer),
                        x_api_key: str | None = Security(_x_api_key)) -> None:
    expected = request.app.state.config.api_key
    if expected is None:
        return
    given = bearer.credentials if bearer is not None else x_api_key
    if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "invalid or missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")


# -- the app ---------------------------------------------------------------------------------------

def _is_anthropic(request: Request) -> bool:
    return request.url.path.startswith(ANTHROPIC_PREFIX)


def _error_response(request: Request, error: ApiError) -> JSONResponse:
    body = anthropic_error_body(error) if _is_anthropic(request) else openai_error_body(error)
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(body, status_code=error.status, headers=headers)


class JsonBodies:
    """ASGI middleware: a POST body is JSON whatever its Content-Type says (curl -d sends
    application/x-www-form-urlencoded), as llama.cpp's and OpenAI's servers treat it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST":
            content_type = dict(scope.get("headers") or ()).get(b"content-type", b"")
            if b"json" not in content_type.lower():
                headers = [(k, v) for k, v in scope.get("headers") or () if k != b"content-type"]
                scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_app(link: DaemonLink, config: GatewayConfig) -> FastAPI:
    app = FastAPI(
        title="flashd", version=_version(),
        description="OpenAI- and Anthropic-compatible HTTP gateway to a flashd daemon. Unknown "
                    "parameters and values flashd cannot honour are answered with a 400 naming them.")
    app.state.link = link
    app.state.config = config
    auth = [Depends(check_api_key)]
    app.include_router(openai_api.router, dependencies=auth, responses=_error_responses(OpenAIErrorBody))
    app.include_router(anthropic_api.router, dependencies=auth, responses=_error_responses(AnthropicErrorBody))

    @app.get("/health", summary="Whether the daemon answers (no API key needed)",
             responses={503: {"model": OpenAIErrorBody, "description": "The daemon does not answer."}})
    async def health(request: Request) -> dict:
        status = await link.status()
        return {"status": "ok", "model": link.model_id, "max_ctx": link.max_ctx,
                "daemon": {key: status.get(key) for key in ("backend", "running", "queued", "served")}}

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, error: ApiError) -> JSONResponse:
        return _error_response(request, error)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        hints = ANTHROPIC_HINTS if _is_anthropic(request) else OPENAI_HINTS
        message, param = validation_message(error.errors(), hints)
        return _error_response(request, ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if 400 <= error.status_code <= 599 else 500
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(status, str(error.detail))
        return _error_response(request, ApiError(status, message))

    @app.exception_handler(UnicodeEncodeError)
    async def on_bad_unicode(request: Request, error: UnicodeEncodeError) -> JSONResponse:
        # A lone surrogate ("\ud800" is valid JSON) in a string sent on to the daemon.
        return _error_response(request, ApiError(400, f"the request holds text that is not valid Unicode: "
                                                      f"{error.reason}"))

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, error: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED_STATUS)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error_response(request, ApiError(500, f"internal error in flashd: {type(error).__name__}: {error}"))

    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)   # 413 before a large body is read
    _document_400_not_422(app)
    return app


def _document_400_not_422(app: FastAPI) -> None:
    """Drop FastAPI's automatic 422 entries from /openapi.json: validation errors are 400s."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for methods in schema.get("paths", {}).values():
                for operation in methods.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
