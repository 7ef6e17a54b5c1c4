"""`python -m paddlecloud.builder --config FILE`."""

import sys

from paddlecloud.common.runner import service_main

from .app import create_app

sys.exit(service_main("builder", create_app))
