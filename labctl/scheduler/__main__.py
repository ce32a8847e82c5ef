"""The worker process: `python -m labctl.scheduler worker ARGS` runs one experiment (see `worker`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from labctl.scheduler.worker import _worker_main

if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "worker":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(asyncio.run(_worker_main(json.loads(sys.argv[2]))))
