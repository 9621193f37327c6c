"""What the worker's two schedulers share. Each decides which requests' rows the engine decodes at each
step, in a module of its own: translate_scheduler.TranslationScheduler, generate_scheduler.GenerationScheduler.
No LitServe here: the worker loop (litserve_bridge.SchedulerLoop) feeds a scheduler the requests it takes off
the queue and runs it one step at a time; the LitAPIs (translate_api, generate_api) turn a request into a job
(validation, tokenizing) and a job into its answer. Both schedulers are driven alike:

    admit({key: job})     requests join, also while others are under way (key: the caller's name for each)
    busy                  whether there is work left: call step()
    wants_new_requests()  whether a request arriving now would start before the work under way ends (the
                          loop looks at its queue between steps only then: each look costs a round trip, and
                          a request this worker has no room for is better left to another)
    step()                one decoder step
    take_finished()       translation: the requests that can be answered now, which the scheduler forgets
    take_progress()       generation: every request held, each with whether it is over (the over ones leave)
    abandon()             forget everything (after an unexpected exception, whose requests the loop fails)

Failures: a request that cannot be served is a `Failure` value, never an exception, so its batch-mates are
still served; a translation search or decoder step that raises has its sentences retried one at a time, a
generation step that raises fails the requests whose rows were in it only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("transerve")

# On CPU a running batch holds at most this many rows (sentences x beams): a decoder step, what a request
# that joins waits for at most, then stays short. 2 cores, beam 16, 64 short sentences: 256 rows a call
# took 13.0 s in all, 180 ms a step; 1024 rows 13.6 s, 700 ms a step (benchmarks/results/fairness.md).
CPU_BATCH_ROWS = 256
GAUGE_S = 0.05      # the running rows, waiting requests and cache gauges are set this often at most


# --- failures: one request's, never its batch-mates' ----------------------------------------------------
@dataclass
class Failure:
    status: int
    type: str
    message: str
    limit: int | None = None

    def to_dict(self) -> dict:
        err = {"type": self.type, "message": self.message}
        if self.limit is not None:
            err["limit"] = self.limit
        return {"error": err, "status": self.status}


def internal_failure() -> Failure:
    """What a request gets when the worker raises on it (its batch-mates are still served)."""
    return Failure(500, "internal_error", "the inference worker failed on this request; the server logged why")


def for_one_request(hook: str, request_id: str, fn, *args):
    """fn(*args) for one request of a batch, or internal_failure() if it raises: raised in the worker loop,
    the exception would fail every request of the batch."""
    try:
        return fn(*args)
    except Exception:
        # request_id=: the one form a client's X-Request-ID may be written in (docs/serving.md)
        log.exception("%s failed (request_id=%s)", hook, request_id)
        return internal_failure()


