"""An Anthropic request converted as the pinned llama-server converts it, for its template."""

from __future__ import annotations

from twisted.trial.unittest import TestCase

from mrunner.cache.anthropic import chat_body

TEXT = {"type": "text", "text": "a.txt"}
HEADER = "x-anthropic-billing-header: cc_version=2; cch="


class ConversionTests(TestCase):
    def test_system_blocks_and_the_billing_stamp(self) -> None:
        body = {
            "system": [
                {
                    "type": "text",
                    "text": HEADER + "a5145;You are Claude.",
                },
                {"type": "text", "text": " Be brief."},
            ],
            "messages": [{"role": "user", "content": "hi"}],
        }
        system, user = chat_body(body)["messages"]
        self.assertEqual(system["content"], HEADER + "fffff;You are Claude. Be brief.")
        self.assertEqual(user, {"role": "user", "content": "hi"})

    def test_tool_use_results_and_thinking(self) -> None:
        body = {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "look it up"},
                        {"type": "tool_use", "id": "t1", "name": "ls", "input": {"b": 1, "a": "é"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "a.txt"}],
                        },
                        {"type": "text", "text": "and?"},
                    ],
                },
                {"role": "assistant"},
            ],
            "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
        }
        chat = chat_body(body)
        call, user, result = chat["messages"]
        self.assertEqual(call["content"], "")
        self.assertEqual(call["reasoning_content"], "look it up")
        self.assertEqual(call["tool_calls"][0]["function"], {"name": "ls", "arguments": '{"a":"é","b":1}'})
        self.assertEqual(user, {"role": "user", "content": [{"type": "text", "text": "and?"}]})
        self.assertEqual(result, {"role": "tool", "tool_call_id": "t1", "content": "a.txt"})
        self.assertEqual(chat["tools"][0]["function"]["parameters"], {"type": "object"})
        self.assertEqual(chat["tool_choice"], "required")
