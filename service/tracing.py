"""Traces, through the OpenTelemetry SDK: the one module that knows OpenTelemetry's names. Off by default, and
then at no cost: nothing here imports OpenTelemetry, and every call returns NOOP (a span that records
nothing). On when the standard variables ask for it:

    OTEL_TRACES_EXPORTER          otlp (OTLP over HTTP/protobuf) or console; none, or unset with no endpoint: off
    OTEL_EXPORTER_OTLP_ENDPOINT   the collector (…/v1/traces is added), or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
                                  either alone turns traces on
    OTEL_TRACES_SAMPLER (_ARG)    the SDK's samplers; default parentbased_always_on (a client's sampled flag wins)
    OTEL_SERVICE_NAME             default "transerve"
    OTEL_SDK_DISABLED=true        off, whatever the others say

and the SDK's own (OTEL_BSP_SCHEDULE_DELAY, OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES, ...).

Each process makes its own tracer the first time it traces (the HTTP processes are forked and the inference
workers spawned: an exporter's thread does not survive a fork), with `process.pid` in its resource, so a trace
shows which process ran each span. A request's context crosses from the HTTP process into a worker as W3C
trace-context fields in its payload (`current_carrier`, then `start_span(..., parent=carrier)`).

The provider is this module's alone, never made OpenTelemetry's global one: FastAPI's own telemetry (0.165) and
redis's would trace through a global provider too, FastAPI's with exception messages, which may quote a request.

Nothing a client sends goes into a span: callers give names, counts and ids; an error is recorded by its type,
never its message or stack (record_exception is off: a message may quote a request).
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Iterator

log = logging.getLogger("transerve")

SERVICE_NAME = "transerve"
_state: dict = {}   # "on": whether tracing is on (read once); "pid", "tracer": this process's tracer


def enabled() -> bool:
    """Whether the OTEL_* variables ask for traces (read once per process)."""
    if "on" not in _state:
        env = os.environ
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        _state["on"] = not disabled and exporter != "none" and bool(exporter or endpoint)
    return _state["on"]


def _tracer():
    """This process's tracer, made at its first use (after a fork, anew)."""
    if _state.get("pid") != os.getpid():
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"process.pid": os.getpid()}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = SERVICE_NAME
        provider = TracerProvider(resource=Resource.create(attributes))   # the sampler: OTEL_TRACES_SAMPLER
        provider.add_span_processor(BatchSpanProcessor(_exporter()))
        _state.update(pid=os.getpid(), tracer=provider.get_tracer("transerve"))
        log.info("traces on in process %d: service %s, sampler %s", os.getpid(),
                 provider.resource.attributes.get("service.name"), provider.sampler.get_description())
    return _state["tracer"]


def _exporter():
    """The console's or OTLP over HTTP/protobuf, the one protocol shipped (another asked for is said, not obeyed)."""
    env = os.environ
    name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if name not in ("", "otlp") or protocol not in ("", "http/protobuf"):
        log.warning("traces go out as OTLP over HTTP/protobuf, the exporter this server ships (asked for: "
                    "OTEL_TRACES_EXPORTER=%s, OTEL_EXPORTER_OTLP_PROTOCOL=%s)", name or "-", protocol or "-")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()   # its endpoint, headers and timeout from OTEL_EXPORTER_OTLP_*


class Span:
    """One span, as our modules handle it: attributes, events, an error type, its end, its ids."""

    def __init__(self, span=None):
        self.otel = span     # the OpenTelemetry span; None: NOOP

    def set(self, **attributes) -> None:
        """Attributes under our names: `transerve.` is prefixed unless the name has a dot (a semantic
        convention's, e.g. http.route); None values are left out."""
        if self.otel is not None:
            self.otel.set_attributes(_named(attributes))

    def event(self, name: str, **attributes) -> None:
        if self.otel is not None:
            self.otel.add_event(name, _named(attributes))

    def fail(self, error_type: str) -> None:
        """Marks the span failed, with the error's type alone."""
        if self.otel is not None:
            from opentelemetry.trace import Status, StatusCode
            self.otel.set_attribute("error.type", error_type)
            self.otel.set_status(Status(StatusCode.ERROR))

    def end(self, end_ns: int | None = None) -> None:
        if self.otel is not None:
            self.otel.end(end_time=end_ns)

    @property
    def trace_id(self) -> str | None:
        """32 hex digits (None when off)."""
        return None if self.otel is None else format(self.otel.get_span_context().trace_id, "032x")

    def carrier(self) -> dict[str, str]:
        """This span's context as W3C trace-context fields ({"traceparent": ...}), for another process."""
        if self.otel is None:
            return {}
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        out: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(out, set_span_in_context(self.otel))
        return out


NOOP = Span()
_NOTHING = nullcontext(NOOP)


def _named(attributes: dict) -> dict:
    return {(k if "." in k else f"transerve.{k}"): v for k, v in attributes.items() if v is not None}


def start_span(name: str, parent: dict[str, str] | Span | None = None, start_ns: int | None = None,
          links: list[Span] = (), server: bool = False, **attributes) -> Span:
    """A span begun (end it with .end()), not made current. `parent`: W3C fields (a `traceparent` header, a
    payload's carrier) or a Span; None: the current span, if any. `server`: the span of a request served."""
    if not enabled():
        return NOOP
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if isinstance(parent, Span):
        context = trace.set_span_in_context(parent.otel) if parent.otel is not None else None
    else:
        context = TraceContextTextMapPropagator().extract(parent) if parent is not None else None
    span = _tracer().start_span(
        name, context=context, kind=trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL,
        attributes=_named(attributes), start_time=start_ns, record_exception=False, set_status_on_exception=False,
        links=[trace.Link(s.otel.get_span_context()) for s in links if s.otel is not None])
    return Span(span)


def current_carrier() -> dict[str, str]:
    """The current span's context as W3C trace-context fields, for another process ({} when off or none)."""
    if not enabled():
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    out: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(out)
    return out


def use_span(span: Span) -> AbstractContextManager:
    """Makes `span` the current one in this context (the parent of spans started within), without ending it.
    NOOP's is a context manager that does nothing (no generator made per request)."""
    if span.otel is None:
        return _NOTHING
    from opentelemetry import trace
    return trace.use_span(span.otel, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def child_span(name: str, **attributes) -> AbstractContextManager[Span]:
    """A child of the current span, current while the block runs and ended after it; an exception out of the
    block marks it failed by the exception's type (an ApiError's `type`), never its message."""
    return _child_span(name, attributes) if enabled() else _NOTHING


@contextmanager
def _child_span(name: str, attributes: dict) -> Iterator[Span]:
    s = start_span(name, **attributes)
    try:
        with use_span(s):
            yield s
    except BaseException as e:
        s.fail(error_type(e))
        raise
    finally:
        s.end()


def error_type(e: BaseException) -> str:
    """What a span says of an exception: an ApiError's `type` (e.g. "overloaded"), else the exception's class."""
    named = getattr(e, "type", None)
    return named if isinstance(named, str) else type(e).__name__
