"""The front door: the site that applies the trust rules before a body is read, who the caller is,
and the root resource that gives each request to the route group that knows its path."""
