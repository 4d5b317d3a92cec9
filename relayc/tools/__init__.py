"""Tools built on the reference engine, not parts of it.

generate.py  ``relayc generate``: stream one completion from the engine
demo.py      ``relayc demo``: every bundled algorithm against ``none`` on the shipped models
train/       ``python -m relayc.tools.train``: train the shipped demo models
"""
