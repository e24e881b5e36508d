"""Runtime internals: authentication and framing, rendezvous, environment detection, the process context."""
