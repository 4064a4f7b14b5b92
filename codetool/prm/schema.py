"""The HTTP schema of ``codetool serve-prm`` (:mod:`codetool.prm.server`): the request and response
bodies as pydantic models, with a description and an example for every field.

The models are the documentation and the list of accepted fields: ``GET /openapi.json`` (and the
``/docs`` page) show them, and the server refuses a field they do not declare, naming it (a typo
such as ``candiate_output`` is a 422, not a field silently ignored). The server itself parses
bodies with its own checks (fast, and off the event loop for large bodies); a test keeps the two
in step. An item holds what the PRM reads of one candidate step (the fields of a PRM example,
docs/DESIGN.md §3); how they are rendered into the prompt is :mod:`codetool.prm.format`.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

API_DESCRIPTION = ("Scores candidate steps of a code-writing agent with a process reward model (CodeTool, ACL "
                   "2025). POST /score {\"items\": [...]} answers {\"scores\": [...]}, one probability per item. "
                   "Send the K candidates of one step in one request: they share their prefix. Guide: docs/SERVING.md.")

EXAMPLE_ITEM: dict[str, Any] = {
    "query": "Which books by Ursula K. Le Guin are on the shelf?",
    "tools": "def get_books(q: str, available: bool = None):\n    \"\"\"Search the catalogue.\"\"\"",
    "history": [{"code": "books = get_books(q='Le Guin')\nprint(books)",
                 "output": "{'results': [{'book_id': 17, 'available': True}]}"}],
    "candidate": "finish('The Left Hand of Darkness (book 17) is on the shelf.')",
    "candidate_output": "",
}


class HistoryStep(BaseModel):
    """One earlier step of the episode, as the policy chose it."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field("", description="the step's Python code")
    output: str = Field("", description="what running the code printed or raised (cut as your agent shows it)")
    plan: str = Field("", description="the step's one-line plan, when the policy writes one before the code")


class ScoreItem(BaseModel):
    """One candidate step to score."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": EXAMPLE_ITEM})

    query: str = Field(..., description="the user request the episode answers")
    tools: str = Field("", description="the tools as the policy saw them: Python signatures with docstrings "
                                       "(what `codetool.tools.render_tools` writes); the PRM was trained on that text")
    history: list[HistoryStep] = Field(default_factory=list, description="the earlier chosen steps, oldest first")
    candidate: str = Field("", description="the candidate step's code")
    candidate_output: str = Field("", description="what running the candidate printed or raised; read only by "
                                                  "PRMs trained with `format.candidate_output: show` (the default "
                                                  "hides it, as the paper's PRM)")
    candidate_plan: str = Field("", description="the candidate reply's plan line, when the policy writes one")
    step_text: str = Field("", description="reference interface only (`format.interface: reference`): the "
                                           "candidate's whole reply")
    previous_steps: str = Field("", description="reference interface only: the earlier steps' replies")
    parent_result: str = Field("", description="reference interface only: the parent step's output")


class ScoreRequest(BaseModel):
    """``POST /score``: the items to score (an empty list is answered at once with no scores)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"items": [EXAMPLE_ITEM]}})

    items: list[ScoreItem] = Field(..., description="candidate steps; at most the server's --max_items")


class ScoreResponse(BaseModel):
    """The answer to ``POST /score``."""

    model_config = ConfigDict(json_schema_extra={"example": {"scores": [0.73]}})

    scores: list[float] = Field(..., description="one per item, in order: the PRM's probability in [0, 1] that "
                                                 "the step is the more promising one (higher is better)")


class ErrorResponse(BaseModel):
    """Every error: a 4xx for a request to fix, 503/504 for the server's state."""

    error: str = Field(..., description="one line: what was wrong and how to fix it")


class HealthResponse(BaseModel):
    """``GET /health``: 200 when every scoring worker is alive, else 503 (the dead ones are restarted)."""

    status: str = Field(..., description="ok, or unhealthy when a scoring worker had died")
    prm: str = Field(..., description="the PRM being served")
    workers: int = Field(..., description="scoring threads configured")
    workers_alive: int = Field(..., description="scoring threads alive when the request arrived")
    worker_restarts: int = Field(0, description="scoring threads restarted since the server started")


ITEM_FIELDS = tuple(ScoreItem.model_fields)
HISTORY_FIELDS = tuple(HistoryStep.model_fields)
REQUEST_FIELDS = tuple(ScoreRequest.model_fields)


def openapi_schemas() -> dict[str, dict]:
    """The models' JSON schemas for the OpenAPI document's ``components.schemas``."""
    schemas: dict[str, dict] = {}
    for model in (ScoreRequest, ScoreResponse, ErrorResponse, HealthResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def unknown_field(obj: dict, known: tuple[str, ...]) -> str | None:
    """``"<field>: unknown field; did you mean '<closest>'?"`` for the first key of ``obj`` not in
    ``known``, or `None` when every key is declared."""
    for key in obj:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"the fields are {', '.join(known)}"
            return f"{str(key)[:60]}: unknown field; {hint} (see GET /openapi.json)"
    return None


def install_openapi(app: Any) -> None:
    """Make ``app`` (FastAPI) serve an OpenAPI document whose components hold these models (the
    ``/score`` route reads its body itself, so FastAPI cannot see the request model)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(openapi_schemas())
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi
