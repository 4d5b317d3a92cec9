"""The typed ops (nodes) a decode step may call, each with its signature and meta function."""
