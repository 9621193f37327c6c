"""python -m service --model models/de-en [--model …] [--host] [--port 8000] [--max-batch-size] …"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from .config import parse_settings
    from .metrics import configure

    settings = parse_settings(argv)
    # Before anything creates a metric: workers are spawned and inherit the directory.
    configure()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .app import build_server
    from .engine import PackageError

    try:
        server = build_server(settings)
    except PackageError as e:
        print(f"error: cannot serve: {e}", file=sys.stderr)
        return 2
    server.run(host=settings.host, port=settings.port, num_api_servers=settings.api_servers,
               log_level=settings.log_level, generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
