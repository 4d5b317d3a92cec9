"""``python -m relayc.engine.train``: see ``relayc.engine.train.cli``."""

from relayc.engine.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
