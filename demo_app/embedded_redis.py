"""An embedded Redis for machines without one: ``python -m demo_app.embedded_redis --port P``.

fakeredis's TCP server speaks the Redis protocol, runs Lua through lupa and
serves pub/sub, so every gunicorn worker can share it over TCP exactly as
they would share a redis-server. It is a demo convenience, not a store for
production: one process, no persistence, slower than the real thing.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import fakeredis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo_app.embedded_redis")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = fakeredis.TcpFakeServer((args.host, args.port), server_type="redis")
    server.daemon_threads = True  # connection threads must not keep the process alive
    # Stop at once on SIGTERM/SIGINT: there is nothing to save.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    print(f"embedded redis (fakeredis) listening on redis://{args.host}:{args.port}/0", flush=True)
    server.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
