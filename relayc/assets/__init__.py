"""Data files shipped with relayc: the trained demo models in ``demo/`` (see its MODEL_CARD.md)."""
