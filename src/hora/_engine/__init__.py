"""The background engine: a queue of requests, coordinator negotiation, and execution on the data plane."""
