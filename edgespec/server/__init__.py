"""`edgespec serve`: an OpenAI-compatible HTTP face over the chat and engine layers.

    api.py         routes, the API key and body-size guard, SSE streaming (create_app)
    schemas.py     request and response bodies, as the OpenAI API shapes them
    completion.py  what a request runs on the engine: prompt tokens, generation, statistics
    engine_thread.py  the one thread that uses the engine, one job at a time in arrival order
    error_replies.py  errors as OpenAI words them
    listen.py      binding (loopback unless an API key is set) and running until Ctrl+C

Needs the `serve` extra: pip install 'edgespec[serve]'.
"""

from edgespec.server.api import MAX_BODY_BYTES, ServerSettings, create_app
from edgespec.server.listen import bind, check_exposure, run, url

__all__ = ["MAX_BODY_BYTES", "ServerSettings", "bind", "check_exposure", "create_app", "run", "url"]
