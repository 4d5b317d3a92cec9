"""``python -m relayc.tools.train``: see ``relayc.tools.train.cli``."""

from relayc.tools.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
