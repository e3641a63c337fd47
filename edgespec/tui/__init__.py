"""The Textual chat app (`edgespec` with no subcommand)."""

from __future__ import annotations


def run_app(*, pair: str | None = None, target: str | None = None, draft: str | None = None, no_draft: bool = False,
            template: str | None = None, rpc=None, cache=None, load=None, root=None) -> None:
    """Open the chat app on a registry pair (default: the bundled one) or on model files / names
    (`no_draft`: the target alone).
    `rpc`: a Split (RPC workers, tensor split, output layer) for the target, instead of the settings' workers;
    `cache`: the engine's CacheSettings (default: edgespec.load.kv_cache());
    `load`: the command line's LoadSettings: those it gives replace the default settings' for this run;
    `root`: the project folder files are attached from (default: the current folder)."""
    import sys

    from edgespec.errors import EdgespecError, Terminated
    from edgespec.tui.app import EdgespecApp
    from edgespec.tui.library import ModelChoice

    # Textual reads keys from stdin and draws on stderr: without a terminal there, the app
    # draws into a pipe or a file and waits for keys that never come.
    for name in ("stdin", "stderr"):
        if not getattr(sys, name).isatty():
            raise EdgespecError(f"the chat app needs a terminal, and {name} is not a terminal: in scripts, "
                                "use `edgespec generate` or `edgespec chat` (see --help)")
    if target:
        choice = ModelChoice(target=target, draft=draft, no_draft=no_draft)
    else:
        from edgespec.models.registry import DEFAULT_PAIR

        choice = ModelChoice(pair=pair or DEFAULT_PAIR, draft=draft, no_draft=no_draft)
    app = EdgespecApp(choice, template=template, rpc=rpc, cache=cache, load_given=load, root=root)
    app.run()
    if app.ended_by is not None:  # the app has closed as on its quit key: the launcher ends by the signal
        raise Terminated(app.ended_by)
