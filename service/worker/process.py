"""What every inference process does first, whichever endpoint it serves."""

from __future__ import annotations

from ..config import Settings, lower_worker_priority
from ..logs import configure as configure_logs
from ..stopping import Stopping, die
from .cancel import CancelBoard


def start_worker(endpoint: str, settings: Settings, board: CancelBoard, stopping: Stopping | None) -> None:
    """Called first in a LitAPI's setup(): on LitServe's queues the gateway then fails what a dead predecessor held
    (with the workers' sockets, the worker's listening does: worker/litserve_bridge.py); SIGINT and SIGTERM
    stop this process once the main process has drained (`stopping` None outside a server, in tests: the signals
    are left alone); the HTTP processes' CPU comes before this one's; a spawned process logs as the main process
    was told to."""
    board.worker_started(endpoint)
    if stopping is not None:
        stopping.guard(die)
    lower_worker_priority(settings)
    configure_logs(settings.log_level, settings.log_format)
