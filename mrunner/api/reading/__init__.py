"""Reading requests: bodies within their limits, strict JSON, and the rules each route's body meets."""
