"""What generated modules import at run time: device helpers, events, graph runner."""
