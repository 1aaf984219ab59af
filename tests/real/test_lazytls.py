"""pyOpenSSL (and C{cryptography}) loaded only when the daemon uses TLS (L{mrunner.daemon.lazytls}).

Each case runs a fresh Python or a real ``twistd``: what a process has imported
cannot be undone in this one, whose reactor loaded pyOpenSSL long ago.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import urllib.request
from pathlib import Path

from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from mrunner.daemon.lazytls import TLS_METHODS, TLS_NAMES
from tests.support.daemon import eventually, free_port, short_home, spawn_twistd, stop_twistd, write_config
from tests.support.front_door import self_signed

# What a module binds, as comparable text: for each TLS name of lazytls.TLS_NAMES, and each method
# twisted.web.client decorates when it loads without TLS.
DUMP = """
import importlib, json, sys
from twisted.internet import reactor
import twisted.web.client as client

TLS_NAMES, TLS_METHODS = json.loads(sys.argv[1])
modules = {name: importlib.import_module(name) for name in TLS_NAMES}

def text(value):
    return f"{type(value).__name__} {getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"

dump = {name: {key: text(value) for key, value in sorted(vars(mod).items())} for name, mod in modules.items()}
for cls, method in TLS_METHODS:
    found = vars(getattr(client, cls))[method]
    dump[cls + "." + method] = [found.__code__.co_firstlineno, hasattr(found, "__wrapped__")]
print(json.dumps(dump))
"""
LOADED = "print(json.dumps(sorted(m for m in ('OpenSSL', 'cryptography') if sys.modules.get(m))))"
# A request over https through twisted.web's Agent with its default policy, as the store makes them.
FETCH = """
import sys
import mrunner.tap
from twisted.internet import reactor, task
from twisted.web.client import Agent, readBody

async def main(reactor):
    response = await Agent(reactor).request(b"GET", sys.argv[1].encode())
    print(response.code, (await readBody(response)).decode())

task.react(lambda reactor: __import__("twisted").internet.defer.ensureDeferred(main(reactor)))
"""


async def python(*code: str, argv: tuple[str, ...] = (), env: dict[str, str] | None = None) -> str:
    """What a fresh Python prints running C{code}, joined by lines; it must exit 0."""
    out, err, code_ = await getProcessOutputAndValue(
        sys.executable, ["-c", "\n".join(code), *argv], env={**os.environ, **(env or {})}
    )
    if code_ != 0:
        raise AssertionError(f"exit {code_}: {err.decode()}")
    return str(out.decode())


def maps_cryptography(pid: int) -> bool:
    """Whether the process C{pid} has cryptography's compiled bindings mapped."""
    return "cryptography" in Path(f"/proc/{pid}/maps").read_text()


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class LazyTLSTests(TestCase):
    timeout = 60

    async def test_the_daemon_imports_no_tls_until_it_is_used(self) -> None:
        loaded = await python(
            "import json, sys", "import mrunner.tap", "from twisted.internet import reactor", LOADED
        )
        self.assertEqual(json.loads(loaded), [])
        armed = await python("import json, sys, mrunner.tap", "mrunner.daemon.lazytls.arm()", LOADED)
        self.assertEqual(json.loads(armed), ["OpenSSL", "cryptography"])

    async def test_armed_modules_bind_what_a_normal_import_binds(self) -> None:
        """A Twisted release that changes what its modules bind with TLS fails here."""
        names = (json.dumps([list(TLS_NAMES), TLS_METHODS]),)
        normal = json.loads(await python(DUMP, argv=names))
        deferred = json.loads(await python("import mrunner.tap", DUMP, argv=names))
        armed = json.loads(
            await python("import mrunner.tap", "mrunner.daemon.lazytls.arm()", DUMP, argv=names)
        )
        self.assertNotEqual(deferred, normal)  # or this test would prove nothing
        self.assertEqual(armed, normal)

    async def test_a_daemon_on_tls_and_an_https_client_that_arms_itself(self) -> None:
        home = short_home(self)
        pem = home / "daemon.pem"
        self_signed(pem)
        port = free_port()
        plain = write_config(home, 'listen = "unix:{}"'.format(home / "api.sock"))
        process = spawn_twistd(plain, home, output_name="plain.out")
        self.addCleanup(lambda: ensureDeferred(stop_twistd(process)))
        await eventually(lambda: (home / "api.sock").exists(), 10)
        self.assertFalse(maps_cryptography(process.pid))

        other = short_home(self)
        tls = spawn_twistd(
            write_config(other),
            other,
            "--listen",
            f"ssl:{port}:interface=127.0.0.1:privateKey={pem}",
            output_name="tls.out",
        )
        self.addCleanup(lambda: ensureDeferred(stop_twistd(tls)))
        url = f"https://localhost:{port}/health"
        trusted = ssl.create_default_context(cafile=str(pem))

        def get() -> bytes:
            with urllib.request.urlopen(url, context=trusted, timeout=5) as response:
                return bytes(response.read())

        await eventually(lambda: listening(port), 20)
        self.assertIn(b"ok", await deferToThread(get))
        self.assertTrue(maps_cryptography(tls.pid))
        # The store's client (twisted.web's Agent, its default HTTPS policy) in a process that deferred TLS.
        fetched = await python(FETCH, argv=(url,), env={"SSL_CERT_FILE": str(pem)})
        self.assertEqual(fetched.split()[0], "200")
