"""The pinned whisper.cpp source, the three changes mrunner makes to it, and where its builds are kept.

The source is the whisper.cpp tree vendored in the pywhispercpp sdist (its ``examples/server``
included), fetched by pip as llama.cpp's is. Its ``whisper-server`` listens only on TCP; its HTTP
library (cpp-httplib 0.20) listens on a UNIX socket when told to, so one patch tells it to when the
host it is given ends in ``.sock``, as llama-server does: a runner is then as private as
llama-server's (a socket file of mode 0600), with no port another local user could reach. The
other gives a ``text`` answer the type OpenAI gives it, ``text/plain``, not ``text/html`` (which
a browser would render: the words are whatever the audio said). The third gives its 400s
(cpp-httplib's error handler makes each one a plain "Invalid request") OpenAI's error shape, as
mrunner's own refusals have: mrunner checks every field and the file's header first, so what the
runner still refuses is a file whose header is good and whose body it cannot decode.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mrunner.backends import build, variants

PYWHISPERCPP = "1.5.1"
#: The whisper.cpp release vendored in that pywhispercpp sdist (its CMake project's version), and
#: mrunner's patches of it: new patches get a new suffix, so a build made without them is not reused.
PIN = "v1.8.5-mr3"

_BIND = "    if (!svr->bind_to_port(sparams.hostname, sparams.port))\n"
UNIX_SOCKET_PATCH = (
    "examples/server/server.cpp",
    _BIND,
    "    const std::string & host = sparams.hostname;\n"
    '    if (host.size() > 5 && host.compare(host.size() - 5, 5, ".sock") == 0) {\n'
    "        svr->set_address_family(AF_UNIX);\n"
    "    }\n" + _BIND,
)
AUDIO_ERROR_PATCH = (
    "examples/server/server.cpp",
    'res.set_content("Invalid request", "text/plain");',
    'res.set_content("{\\"error\\":{\\"message\\":\\"the file could not be decoded as audio\\",'
    '\\"type\\":\\"invalid_request_error\\",\\"param\\":\\"file\\",\\"code\\":\\"invalid_file\\"}}",'
    ' "application/json");',
)
TEXT_TYPE_PATCH = (
    "examples/server/server.cpp",
    'res.set_content(results.c_str(), "text/html; charset=utf-8");',
    'res.set_content(results.c_str(), "text/plain; charset=utf-8");',
)

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DWHISPER_BUILD_EXAMPLES=ON",
    "-DWHISPER_BUILD_SERVER=ON",
    "-DWHISPER_BUILD_TESTS=OFF",
    "-DWHISPER_CURL=OFF",
    "-DWHISPER_SDL2=OFF",
)

SOURCE = build.Source(
    name="whisper.cpp",
    package="pywhispercpp",
    version=PYWHISPERCPP,
    tree="whisper.cpp",
    pin=PIN,
    target="whisper-server",
    cmake_flags=CMAKE_FLAGS,
    # whisper-server has no --version; --help prints its usage and exits 0 without a model.
    verify=("--help",),
    patches=(UNIX_SOCKET_PATCH, TEXT_TYPE_PATCH, AUDIO_ERROR_PATCH),
)


def build_dir(root: Path, variant: str = "cpu") -> Path:
    """The pinned build of C{variant}'s directory under C{root} ($MRUNNER_HOME or the shared cache)."""
    return build.directory(root, SOURCE, variants.directory_name(PIN, variant))


def cached_executable(environ: Mapping[str, str] = os.environ, variant: str = "cpu") -> Path:
    """Where ``python -m mrunner.backends.whispercpp`` (``make backend``) puts the shared build."""
    return build.executable_in(build_dir(build.cache_root({}, environ), variant), SOURCE)
