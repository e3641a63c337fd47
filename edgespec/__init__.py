"""edgespec: chat with local GGUF models, made faster by lossless speculative decoding."""

__version__ = "0.1.0"
