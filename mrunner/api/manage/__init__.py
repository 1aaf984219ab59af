"""The daemon's own routes and model management: status, C{/models}, C{/engines} admin, the OpenAPI."""
