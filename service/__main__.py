"""python -m service --model models/de-en [--model …] [--host] [--port 8000] [--max-batch-size] …"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading

log = logging.getLogger("transerve")


def main(argv: list[str] | None = None) -> int:
    from .config import parse_settings
    from .metrics import configure
    from .worker.unix_listener import socket_base

    settings = parse_settings(argv)
    # Unix sockets (multiprocessing's, ours) are made in the temporary directory: one too long for their paths is
    # given up for /tmp, in this process and the ones it starts.
    if (base := socket_base()) != tempfile.gettempdir():
        print(f"warning: TMPDIR {os.environ.get('TMPDIR')!r} is too long for Unix sockets; using {base}",
              file=sys.stderr)
        os.environ["TMPDIR"], tempfile.tempdir = base, None
    # Before anything creates a metric: workers are spawned and inherit the directory.
    given = "PROMETHEUS_MULTIPROC_DIR" in os.environ
    metrics_dir = configure()
    try:
        return serve(settings)
    finally:
        if not given:   # a directory of our own in /tmp: each start would leave one behind
            shutil.rmtree(metrics_dir, ignore_errors=True)


def serve(settings) -> int:
    from .logs import configure as configure_logs

    configure_logs(settings.log_level, settings.log_format)
    from .server import api_servers, build_server
    from .inference.device import DeviceError
    from .keyfile import KeysFileError
    from .shared.package import PackageError
    from .http.litserve_workers import serving
    from .http.uvicorn_bridge import uvicorn_options

    try:
        server, gateway = build_server(settings)
    except (PackageError, DeviceError, KeysFileError) as e:
        print(f"error: cannot serve: {e}", file=sys.stderr)
        return 2

    stopping = []   # the signal that began the drain

    def on_signal(signum: int) -> None:
        """SIGINT or SIGTERM, from the terminal's Ctrl+C, the process group or this process alone
        (service/stopping.py): drain, then stop every process; a second signal changes nothing."""
        if not serving(server):  # still starting: nothing to drain
            raise KeyboardInterrupt
        if stopping:
            log.info("%s: already stopping (draining for up to %g s)", signal.Signals(signum).name,
                     settings.drain_timeout_s)
            return
        stopping.append(signum)
        log.info("%s: draining for up to %g s, then stopping", signal.Signals(signum).name, settings.drain_timeout_s)
        threading.Thread(target=gateway.drain_and_stop, args=(settings.drain_timeout_s,), daemon=True).start()

    if settings.metrics_port:
        from .metrics import serve_metrics

        serve_metrics(settings.host, settings.metrics_port)
    gateway.stopping.handle_in_main(on_signal)
    # SIGHUP: the HTTP processes re-read the API keys file (http/keys.py); the server goes on.
    # SIGHUP: the HTTP processes re-read the admin keys file too (http/model_control.py).
    signal.signal(signal.SIGHUP, lambda signum, frame: (gateway.keys.hup(), gateway.models.hup()))
    try:
        server.run(host=settings.host, port=settings.port,
                   num_api_servers=api_servers(settings, gateway.device, gateway.keys),
                   log_level=settings.log_level, generate_client_file=False, **uvicorn_options(settings))
    except KeyboardInterrupt:   # a signal before anything was started
        log.info("stopped while starting")
    return 1 if getattr(server, "lost_every_http_process", False) else 0


if __name__ == "__main__":
    sys.exit(main())
