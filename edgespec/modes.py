"""The speculation modes, one list for every layer: the engine runs them,
models.yaml's pairs recommend one, the CLI, the app and the server offer them."""

MODES = ("plain", "draft", "lookup", "auto")
"""No drafter, a draft model, prompt lookup, or chosen per cycle (auto)."""

DEFAULT_MODE = "auto"
"""The mode of a reply that names none, where no pair recommends one (models.yaml)."""
