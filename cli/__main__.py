"""`python -m paddlecloud`: the same command as the `paddlecloud` console script."""

import sys

from .main import main

sys.exit(main())
