"""python -m service --model models/de-en [--model …] [--host] [--port 8000] [--max-batch-size] …"""

from __future__ import annotations

import logging
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    from .config import parse_settings
    from .metrics import configure

    settings = parse_settings(argv)
    # Before anything creates a metric: workers are spawned and inherit the directory.
    configure()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import build_server
    from .engine import DeviceError, PackageError
    from .litserve_bridge import serving
    from .uvicorn_bridge import uvicorn_options

    try:
        server, gateway = build_server(settings)
    except (PackageError, DeviceError) as e:
        print(f"error: cannot serve: {e}", file=sys.stderr)
        return 2

    def on_sigterm(signum, frame):
        if not serving(server):  # still starting: nothing to drain
            raise KeyboardInterrupt
        threading.Thread(target=gateway.drain_and_stop, args=(settings.drain_timeout_s,), daemon=True).start()

    if settings.metrics_port:
        from .metrics import serve_metrics

        serve_metrics(settings.host, settings.metrics_port)
    signal.signal(signal.SIGTERM, on_sigterm)
    server.run(host=settings.host, port=settings.port, num_api_servers=settings.api_servers,
               log_level=settings.log_level, generate_client_file=False,
               **uvicorn_options(settings.header_timeout_s, settings.keep_alive_timeout_s, settings.max_connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
