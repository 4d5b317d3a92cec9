"""``python -m relayc.tools.train [eagle3|dflash] ...``: see ``relayc.tools.train.cli.main``,
which picks the command (``--help`` lists them)."""

from relayc.tools.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
