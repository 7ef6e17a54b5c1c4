"""PaddleCloud's client side: the `paddlecloud` command, the Python SDK and the helpers training code imports."""

__version__ = "0.1.0"
