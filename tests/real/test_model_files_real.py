"""Models of several files against the real llama-server: shards, a projector, a chat template,
a draft model, and a Hugging Face pull from a stand-in Hub, all through the daemon's HTTP API.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

from twisted.internet.defer import ensureDeferred

from mrunner.cli.package import TarStream, members
from mrunner.testing.tinymodel import IMAGE_SIZE, write_tiny_llama, write_tiny_mmproj
from tests.support.daemon import http, unix_client
from tests.support.hub_server import Repo, StandInHub
from tests.support.llamacpp_cases import LlamaCppTestCase, smollm2

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} says, in mrunner's template:\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def png(size: int) -> bytes:
    """A grey C{size} x C{size} RGB PNG, written by hand (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + bytes([128, 64, 200]) * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


class ModelFilesRealTests(LlamaCppTestCase):
    async def package(
        self, name: str, first: Path, mmproj: Path | None = None, template: Path | None = None
    ) -> None:
        """What C{mrunner package} sends: the tar of the model's files, to C{POST /models/load}."""
        stream = TarStream(members(first, [], mmproj, template))
        response = await http.post(
            f"{self.daemon.url}/models/load",
            params={"name": name},
            data=b"".join(stream.chunks(lambda _: None)),
            headers={"Content-Type": "application/x-tar"},
        )
        self.assertEqual(response.code, 201, await response.text())

    async def chat(self, model: str, content: Any, **kw: Any) -> tuple[int, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}
        return await self.post("/v1/chat/completions", body)

    async def ps(self) -> list[dict[str, Any]]:
        response = await http.get(self.daemon.url + "/engines/ps")
        runners: list[dict[str, Any]] = json.loads(await response.text())
        return runners

    async def runner(self, method: str, path: str, body: Any = None) -> Any:
        """Ask the one runner directly, on its socket: what it was started with."""
        (runner,) = await self.ps()
        response = await unix_client(runner["socket"]).request(method, f"http://runner{path}", json=body)
        return json.loads(await response.text())

    async def test_a_split_model_with_its_own_chat_template(self) -> None:
        await self.start()
        write_tiny_llama(self.home / "split.gguf", shard_tensors=10)
        (self.home / "chat.jinja").write_text(TEMPLATE)
        await self.package(
            "ai/split", self.home / "split-00001-of-00003.gguf", template=self.home / "chat.jinja"
        )
        code, answer = await self.chat("ai/split", "hello")
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer["usage"]["completion_tokens"], 4)
        props = await self.runner("GET", "/props")
        self.assertEqual(props["chat_template"], TEMPLATE)
        rendered = await self.runner(
            "POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}
        )
        self.assertEqual(
            rendered["prompt"],
            "<|im_start|>user says, in mrunner's template:\nhi<|im_end|>\n<|im_start|>assistant\n",
        )
        self.assertTrue(props["model_path"].endswith("model-00001-of-00003.gguf"), props["model_path"])
        (runner,) = await self.ps()
        self.assertGreater(
            runner["memory_estimate"], sum(p.stat().st_size for p in self.home.glob("split-*"))
        )

    async def test_a_vision_chat_and_images_refused_without_a_projector(self) -> None:
        await self.start()
        write_tiny_llama(self.home / "tiny.gguf")
        write_tiny_mmproj(self.home / "mmproj.gguf")
        await self.package("ai/vision", self.home / "tiny.gguf", mmproj=self.home / "mmproj.gguf")
        await self.package("ai/text", self.home / "tiny.gguf")
        image = {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png(IMAGE_SIZE)).decode()},
        }
        code, answer = await self.chat("ai/text", [{"type": "text", "text": "what is this?"}, image])
        self.assertEqual(code, 400, answer)
        self.assertIn("no multimodal projector", answer["error"]["message"])
        self.assertEqual(await self.ps(), [], "refused before any runner loads")
        code, text_only = await self.chat("ai/vision", [{"type": "text", "text": "what is this?"}])
        self.assertEqual(code, 200, text_only)
        code, answer = await self.chat("ai/vision", [{"type": "text", "text": "what is this?"}, image])
        self.assertEqual(code, 200, answer)
        self.assertTrue(answer["choices"][0]["message"]["content"])
        # The 32 x 32 image became (32 / 8)^2 = 16 tokens of the prompt, through the projector.
        self.assertEqual(answer["usage"]["prompt_tokens"] - text_only["usage"]["prompt_tokens"], 16)

    async def test_smollm2_as_its_own_draft_answers_as_plain_decoding(self) -> None:
        await self.start("[runner]\ncontext_size = 512\n", parallel=1)
        await self.daemon.import_model("ai/smollm2", smollm2())
        question = "Name three colours."
        code, plain = await self.chat("ai/smollm2", question, temperature=0, max_tokens=8)
        self.assertEqual(code, 200, plain)
        code, answer = await self.post(
            "/engines/_configure",
            {"model": "ai/smollm2", "speculative": {"draft_model": "ai/smollm2"}},
        )
        self.assertEqual((code, answer["status"]), (200, "configured"), answer)
        code, drafted = await self.chat("ai/smollm2", question, temperature=0, max_tokens=8)
        self.assertEqual(code, 200, drafted)
        self.assertEqual(
            drafted["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]
        )
        self.assertGreater(drafted["timings"].get("draft_n", 0), 0, drafted["timings"])
        (runner,) = [r for r in await self.ps() if r["state"] == "ready"]
        self.assertGreater(runner["memory_estimate"], 2 * smollm2().stat().st_size)

    async def test_a_hugging_face_pull_then_a_chat(self) -> None:
        hub = StandInHub({})
        await self.start_with_hub(hub)
        write_tiny_llama(self.home / "tiny-Q4_K_M.gguf")
        hub.add("team/tiny-gguf", Repo({"tiny-Q4_K_M.gguf": (self.home / "tiny-Q4_K_M.gguf").read_bytes()}))
        response = await http.post(f"{self.daemon.url}/models/create", json={"from": "hf.co/team/tiny-gguf"})
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        self.assertEqual(
            lines[-1],
            {
                "type": "success",
                "message": "Model pulled successfully: hf.co/team/tiny-gguf:latest",
                "mode": "pull",
            },
        )
        self.assertEqual(lines[0]["type"], "progress")
        code, answer = await self.chat("hf.co/team/tiny-gguf", "hello")
        self.assertEqual(code, 200, answer)

    async def start_with_hub(self, hub: StandInHub) -> None:
        endpoint = hub.start()
        self.addCleanup(lambda: ensureDeferred(hub.stop()))
        await self.start(f'[huggingface]\nendpoint = "{endpoint}"\n')
