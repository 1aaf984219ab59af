"""Speech to text through mrunner and the real whisper-server: espeak-ng's speech, the openai client,
each response format, the refusals a runner never sees, and a Whisper runner beside a chat model."""

from __future__ import annotations

import io
import json
import os
import struct
import wave

import httpx

from mrunner.home import Home
from tests.support.daemon import eventually, http
from tests.support.llamacpp_cases import TINY
from tests.support.whisper_cases import WHISPER, WhisperTestCase


def noise(seconds: float, rate: int) -> bytes:
    """A 16-bit mono WAV of C{seconds} of noise."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(os.urandom(2 * int(rate * seconds)))
    return buffer.getvalue()


def lying_wav() -> bytes:
    """35 minutes at 2 kHz whose header claims a byte rate of 10,000,000 (0.8 s by that count)."""
    data = bytearray(noise(35 * 60, 2000))
    struct.pack_into("<I", data, 28, 10_000_000)
    return bytes(data)


class TranscriptionTests(WhisperTestCase):
    async def test_the_openai_client_transcribes_speech(self) -> None:
        await self.start_whisper()
        with self.wav.open("rb") as audio:
            answer = await self.call(self.client.audio.transcriptions.create, model=WHISPER, file=audio)
        self.assertIsInstance(answer.text, str)
        self.assertTrue(answer.text.strip())
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual((runner.backend, runner.mode), ("whisper.cpp", "transcription"))

    async def test_each_format_under_each_prefix(self) -> None:
        await self.start_whisper()
        audio = self.wav.read_bytes()
        expected = {
            "json": "application/json",
            "verbose_json": "application/json",
            "text": "text/plain",
            "srt": "application/x-subrip",
            "vtt": "text/vtt",
        }
        for prefix in ("/v1", "/engines/v1", "/engines/whisper.cpp/v1"):
            for response_format, content_type in expected.items():
                answer = await self.posted(
                    f"{prefix}/audio/transcriptions", audio, model=WHISPER, response_format=response_format
                )
                self.assertEqual(answer.status_code, 200, (prefix, response_format, answer.text))
                self.assertTrue(answer.headers["content-type"].startswith(content_type), response_format)
        srt = await self.posted("/v1/audio/transcriptions", audio, model=WHISPER, response_format="srt")
        self.assertRegex(srt.text, r"^1\n\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d\n")
        verbose = (
            await self.posted(
                "/v1/audio/translations",
                audio,
                model=WHISPER,
                response_format="verbose_json",
                **{"timestamp_granularities[]": "segment"},
            )
        ).json()
        self.assertEqual(verbose["task"], "translate")
        self.assertGreater(verbose["duration"], 1)
        self.assertIsInstance(verbose["segments"], list)

    async def test_refused_before_a_runner(self) -> None:
        await self.start_whisper()
        await self.tiny()
        audio = self.wav.read_bytes()
        refusals = [
            (b"", {}, "invalid_file"),
            (b"GGUF\x03\x00\x00\x00" + bytes(64), {}, "invalid_file_format"),
            (b"just some text", {}, "invalid_file_format"),
            (audio, {"response_format": "docx"}, None),
            (audio, {"temperature": "hot"}, None),
            (audio, {"timestamp_granularities[]": "word"}, None),  # json, not verbose_json
            (audio, {"stream": "true"}, "unknown_parameter"),
            (b"\xff", {}, "invalid_file_format"),  # issue 53 M3: was a 500
            (lying_wav(), {}, "audio_too_long"),  # issue 53 M2: passed as 0.8 s
        ]
        for data, fields, code in refusals:
            answer = await self.posted("/v1/audio/transcriptions", data, model=WHISPER, **fields)
            self.assertEqual(answer.status_code, 400, (fields, answer.text))
            error = answer.json()["error"]
            self.assertEqual(error["type"], "invalid_request_error")
            if code is not None:
                self.assertEqual(error["code"], code)
        chat_model = await self.posted("/v1/audio/transcriptions", audio, model=TINY)
        refused = (chat_model.status_code, chat_model.json()["error"]["code"])
        self.assertEqual(refused, (400, "model_not_whisper"))
        wrong_backend = await self.posted("/engines/llama.cpp/v1/audio/transcriptions", audio, model=WHISPER)
        self.assertEqual(wrong_backend.status_code, 400)
        self.assertEqual(self.daemon.scheduler.snapshot(), [])

    async def test_a_file_only_the_runner_finds_undecodable_is_refused_in_openai_shape(self) -> None:
        await self.start_whisper()
        streaminfo = b"fLaC" + bytes(14) + ((16000 << 44) | 16000).to_bytes(8, "big")  # 1 s said, none there
        answer = await self.posted(
            "/v1/audio/transcriptions", streaminfo + bytes(200), name="x.flac", model=WHISPER
        )
        self.assertEqual(answer.status_code, 400, answer.text)
        error = answer.json()["error"]
        self.assertEqual(
            (error["type"], error["code"], error["param"]), ("invalid_request_error", "invalid_file", "file")
        )

    async def test_a_whisper_runner_and_a_chat_runner_share_the_budget(self) -> None:
        await self.start_whisper()
        await self.tiny()
        answer = await self.posted("/v1/audio/transcriptions", self.wav.read_bytes(), model=WHISPER)
        self.assertEqual(answer.status_code, 200, answer.text)
        chat = await self.call(
            self.client.chat.completions.create,
            model=TINY,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
        )
        self.assertTrue(chat.choices)
        modes = sorted((r.backend, r.mode) for r in self.daemon.scheduler.snapshot())
        self.assertEqual(modes, [("llama.cpp", "completion"), ("whisper.cpp", "transcription")])
        status = json.loads(await (await http.get(self.daemon.url + "/engines/status")).text())
        self.assertIn("whisper.cpp", status)
        self.assertIn("llama.cpp", status)


class OpenAIShapeTests(WhisperTestCase):
    """Issue 53 N5, N6: what OpenAI's clients read where they look for it."""

    async def test_text_as_openai_sends_it_with_one_server_field(self) -> None:
        await self.start_whisper()
        for response_format in ("text", "json"):
            answer = await self.posted(
                "/v1/audio/transcriptions",
                self.wav.read_bytes(),
                model=WHISPER,
                response_format=response_format,
            )
            self.assertEqual(answer.status_code, 200, answer.text)
            self.assertEqual(len(answer.headers.get_list("server")), 1, answer.headers)
            text = answer.text if response_format == "text" else answer.json()["text"]
            self.assertEqual(text, text.strip())
            self.assertTrue(text)

    async def test_word_timestamps_are_top_level(self) -> None:
        await self.start_whisper()
        with self.wav.open("rb") as audio:
            answer = await self.call(
                self.client.audio.transcriptions.create,
                model=WHISPER,
                file=audio,
                response_format="verbose_json",
                timestamp_granularities=["word", "segment"],
            )
        self.assertTrue(answer.words)
        for word in answer.words:
            self.assertEqual(word.word, word.word.strip())
            self.assertLessEqual(word.start, word.end)
        self.assertTrue(answer.segments)
        self.assertEqual(answer.text, answer.text.strip())


class LeavingTests(WhisperTestCase):
    async def test_a_client_that_leaves_stops_the_runners_work(self) -> None:
        """Issue 53 M2: whisper-server's abort callback watches its connection, which mrunner aborts when
        the client goes: 25 minutes of audio stop being transcribed within seconds of the client leaving,
        and the next request is served."""
        await self.start_whisper()
        self.assertEqual(
            (await self.posted("/v1/audio/transcriptions", self.wav.read_bytes(), model=WHISPER)).status_code,
            200,
        )
        long = noise(25 * 60, 4000)

        def leave() -> None:
            with (
                httpx.Client(base_url=self.daemon.url, timeout=3) as client,
                self.assertRaises(httpx.ReadTimeout),
            ):
                client.post(
                    "/v1/audio/transcriptions", files={"file": ("a.wav", long)}, data={"model": WHISPER}
                )

        await self.call(leave)
        log = Home(self.home).runner_log(WHISPER, "transcription")
        await eventually(lambda: "client disconnected, aborted processing" in log.read_text(), 60)
        again = await self.posted("/v1/audio/transcriptions", self.wav.read_bytes(), model=WHISPER)
        self.assertEqual(again.status_code, 200, again.text)


class WhisperStoreTests(WhisperTestCase):
    async def test_a_whisper_model_is_stored_with_its_facts(self) -> None:
        await self.start_whisper()
        response = await http.get(f"{self.daemon.url}/models/{WHISPER}")
        model = json.loads(await response.text())
        config = model["config"]
        self.assertEqual((config["format"], config["architecture"]), ("whisper", "whisper"))
        self.assertEqual(config["whisper"]["languages"], "multilingual")
        self.assertEqual(config["quantization"], "F16")


class EvictionTests(WhisperTestCase):
    async def test_a_whisper_runner_and_a_chat_runner_evict_each_other_when_only_one_fits(self) -> None:
        await self.start_whisper("max_runners = 1\n")
        await self.tiny()
        audio = self.wav.read_bytes()
        first = await self.posted("/v1/audio/transcriptions", audio, model=WHISPER)
        self.assertEqual(first.status_code, 200, first.text)
        await self.call(
            self.client.chat.completions.create,
            model=TINY,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
        )
        self.assertEqual([r.backend for r in self.daemon.scheduler.snapshot()], ["llama.cpp"])
        again = await self.posted("/v1/audio/transcriptions", audio, model=WHISPER)
        self.assertEqual(again.status_code, 200, again.text)
        self.assertEqual([r.backend for r in self.daemon.scheduler.snapshot()], ["whisper.cpp"])


class MetricsTests(WhisperTestCase):
    async def test_audio_seconds_and_the_real_time_factor(self) -> None:
        await self.start_whisper()
        answer = await self.posted("/v1/audio/transcriptions", self.wav.read_bytes(), model=WHISPER)
        self.assertEqual(answer.status_code, 200, answer.text)
        metrics = await (await http.get(self.daemon.url + "/metrics")).text()
        audio = [line for line in metrics.splitlines() if line.startswith("mrunner_audio_seconds_total{")]
        (line,) = audio
        self.assertIn(f'model="{WHISPER}"', line)
        self.assertGreater(float(line.rsplit(" ", 1)[1]), 1.0)  # espeak-ng's sentence lasts seconds
        self.assertIn("mrunner_real_time_factor_count", metrics)


class PreloadTests(WhisperTestCase):
    async def test_a_whisper_model_is_preloaded_by_its_own_backend(self) -> None:
        await self.start_whisper()
        conf = self.daemon.config_path
        conf.write_text(conf.read_text() + f'\n[models]\npreload = ["{WHISPER}"]\n')
        code, reloaded = await self.post("/engines/_reload", {})
        self.assertEqual(code, 200, reloaded)
        await eventually(lambda: [r.mode for r in self.daemon.scheduler.snapshot()] == ["transcription"], 20)
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual((runner.backend, runner.model_name), ("whisper.cpp", WHISPER))


class BudgetTests(WhisperTestCase):
    async def test_the_memory_budget_is_shared_with_the_chat_runners(self) -> None:
        """A budget that holds either runner, not both (the Whisper one is estimated at 200 MiB, the
        tiny chat model's at 24): each load evicts the other."""
        await self.start_whisper('memory_budget = "210MiB"\n')
        await self.tiny()
        audio = self.wav.read_bytes()
        self.assertEqual(
            (await self.posted("/v1/audio/transcriptions", audio, model=WHISPER)).status_code, 200
        )
        (whisper,) = self.daemon.scheduler.snapshot()
        await self.call(
            self.client.chat.completions.create,
            model=TINY,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
        )
        (chat,) = self.daemon.scheduler.snapshot()
        self.assertEqual((whisper.backend, chat.backend), ("whisper.cpp", "llama.cpp"))
        self.assertGreater(whisper.memory + chat.memory, 210 * 2**20)
        self.assertEqual(
            (await self.posted("/v1/audio/transcriptions", audio, model=WHISPER)).status_code, 200
        )
        self.assertEqual([r.backend for r in self.daemon.scheduler.snapshot()], ["whisper.cpp"])
