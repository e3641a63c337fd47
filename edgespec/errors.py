"""Typed errors with messages a user can act on.

Everything below the faces (edgespec.cli, the chat app) raises these; the faces
catch `EdgespecError` once and print its message.
"""


class EdgespecError(Exception):
    """Base class: the message is written for the user."""


class ModelFileError(EdgespecError):
    """A model file is missing, truncated or not GGUF."""


class ModelLoadError(EdgespecError):
    """llama.cpp refused to load a model or create a context."""


class IncompatibleDraftError(EdgespecError):
    """The draft model cannot be paired with the target (vocabularies differ)."""


class ContextFullError(EdgespecError):
    """The prompt alone does not fit in the context window."""


class RegistryError(EdgespecError):
    """models.yaml (or the user's override) is malformed, or a name is unknown."""


class DownloadError(EdgespecError):
    """A model file could not be fetched or failed verification."""


class TemplateError(EdgespecError):
    """A chat template is missing or failed to render."""


class ServeError(EdgespecError):
    """The server cannot start as asked (an address in use, an exposed address without an API key)."""


class WorkerUnreachableError(EdgespecError):
    """An RPC worker (`edgespec worker`, llama.cpp's rpc-server) cannot be reached, or RPC is not built in."""


class WorkerLostError(EdgespecError):
    """An RPC worker holding some of the target's layers went away while in use.
    `fact` names it and says how; the message adds what the user can do (the
    server, which reloads by itself, words that part its own way)."""

    def __init__(self, fact: str):
        super().__init__(f"{fact}. Start it again, then reload the model (the models screen, or run the command again)")
        self.fact = fact
