"""The HTTP layer: Klein apps that parse requests and shape answers; no scheduling here."""
