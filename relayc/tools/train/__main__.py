"""``python -m relayc.tools.train``: see ``relayc.tools.train.cli``; ``python -m
relayc.tools.train eagle3 ...`` trains an EAGLE-3 head (``relayc.tools.train.eagle3_cli``),
``... dflash ...`` a DFlash drafter (``relayc.tools.train.dflash_cli``)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "eagle3":
    from relayc.tools.train.eagle3_cli import main as eagle3_main

    raise SystemExit(eagle3_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "dflash":
    from relayc.tools.train.dflash_cli import main as dflash_main

    raise SystemExit(dflash_main(sys.argv[2:]))

from relayc.tools.train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
