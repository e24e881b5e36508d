"""Transports (the data plane): shared memory within a host, TCP across hosts, and the trivial one for a single
process."""
