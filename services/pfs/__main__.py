"""`python -m paddlecloud.pfs --config FILE`."""

import sys

from paddlecloud.common.runner import service_main

from .app import create_app

# asyncio's loop, not uvloop: downloads go out with loop.sendfile, which uvloop lacks, and
# uploads measured no faster on uvloop (docs/pfs.md, Throughput).
sys.exit(service_main("pfs", create_app, uvloop=False))
