"""The other APIs people's tools speak, one folder per protocol.

Each is translated onto llama-server's OpenAI routes through L{mrunner.api.openai.gateway}."""
