"""OpenAI's Responses API, and the responses kept for C{previous_response_id}."""
