"""The admin routes: model control (service/http/model_control.py), each needing an admin key (--admin-keys-file,
never a users' key; none configured: 403):

    GET  /admin/models                 the served models, each with its versions (active, candidate, retiring)
    POST /admin/models                 {"path", "version"?, "canary"?: {"share", "keys"}}: a package loaded beside
                                       those serving, checked, then serving: a new model, a new version replacing
                                       its model's (the old one unloaded once its requests are answered), or with
                                       "canary" that version's candidate for a share of requests and named keys
    POST /admin/models/canary          {"name", "share", "keys"?}: the candidate's share and keys changed
    POST /admin/models/promote         {"name"}: the candidate serves every request; the old version is unloaded
    POST /admin/models/rollback        {"name"}: the candidate is unloaded; the active version serves every request
    POST /admin/models/unload          {"name"}: the model is no longer served (its pairs go)

Fixed paths, the model named in the body: the middleware leaves them (open_paths) to the admin check here, which
comes before the body is read. A refused load is a 409 whose message says why; errors in our shape.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from .flavour import Flavour
from ..http.gateway import Gateway
from ..http.json_body import add_schema, read_model, request_body
from ..shared.schemas import Canary, ErrorResponse

MODELS = "/admin/models"
CANARY, PROMOTE, ROLLBACK, UNLOAD = (f"{MODELS}/{x}" for x in ("canary", "promote", "rollback", "unload"))
ERRORS = {c: {"model": ErrorResponse} for c in (400, 401, 403, 404, 409, 422, 503)}
TAGS = ["admin"]


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(..., min_length=1, max_length=4096, description="The package's directory on the server")
    version: str | None = Field(None, description="Its version id (default: model.json's \"version\", else the "
                                "first 12 hex digits of model.json's sha256)")
    canary: Canary | None = Field(None, description="Serve it as a candidate beside the active version")


class NamedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=128)


class CanaryRequest(Canary):
    name: str = Field(..., min_length=1, max_length=128)


def install(app: FastAPI, gateway: Gateway) -> None:
    control = gateway.models

    async def listing(request: Request) -> dict:
        control.admin(request)
        return control.listing()

    async def load(request: Request) -> dict:
        admin = control.admin(request)
        body = await read_model(request, LoadRequest)
        canary = body.canary
        return await control.load(body.path, body.version, canary and canary.share, canary and canary.keys, admin)

    async def canary(request: Request) -> dict:
        admin = control.admin(request)
        body = await read_model(request, CanaryRequest)
        return await control.set_canary(body.name, body.share, body.keys, admin)

    def named(action):
        async def route(request: Request) -> dict:
            admin = control.admin(request)
            return await action((await read_model(request, NamedRequest)).name, admin)
        return route

    app.add_api_route(MODELS, listing, methods=["GET"], tags=TAGS, responses=ERRORS,
                      summary="The served translation models and their versions (admin key)")
    app.add_api_route(MODELS, load, methods=["POST"], tags=TAGS, responses=ERRORS,
                      openapi_extra=request_body(LoadRequest),
                      summary="Load a package: a new model, a new version replacing one, or a canary (admin key)")
    app.add_api_route(CANARY, canary, methods=["POST"], tags=TAGS, responses=ERRORS,
                      openapi_extra=request_body(CanaryRequest), summary="Change a canary's share and keys (admin key)")
    for path, action, summary in ((PROMOTE, control.promote, "The candidate version serves every request"),
                                  (ROLLBACK, control.rollback, "The candidate version is unloaded"),
                                  (UNLOAD, control.unload, "A model is no longer served")):
        app.add_api_route(path, named(action), methods=["POST"], tags=TAGS, responses=ERRORS,
                          openapi_extra=request_body(NamedRequest), summary=summary + " (admin key)")


def describe(schema: dict, gateway: Gateway) -> None:
    """The request bodies the routes read themselves, in /openapi.json's components."""
    for model in (LoadRequest, CanaryRequest, NamedRequest):
        add_schema(schema, model)


FLAVOUR = Flavour(install, prefix="/admin/", open_paths=frozenset({MODELS, CANARY, PROMOTE, ROLLBACK, UNLOAD}),
                  describe=describe)
