"""OpenAI's inference routes, and the gateway: the path every API's inference takes to a runner.

The other APIs translate onto llama-server's OpenAI routes, so they go through here too."""
