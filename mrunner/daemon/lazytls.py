"""TLS, and the C{cryptography} package under it, loaded only when the daemon uses it.

Twisted's TCP transports, endpoints and HTTP client import pyOpenSSL as they
load, whenever it is installed; pyOpenSSL imports C{cryptography}: 13 MB of
the idle daemon's 62 MB RSS. The daemon uses TLS only to listen on an C{ssl:}
or C{tls:} endpoint (known once its options are read) and to reach an https
registry or hub (when a pull or push first does). So importing this module,
first thing in L{mrunner.tap}, hides pyOpenSSL from the imports that follow
(Python's own rule: a C{None} in C{sys.modules} makes the import fail), and
Twisted's modules take their "no TLS" branch; L{arm} imports it and gives
those modules what their TLS branch would have, the first time a caller
needs it: L{mrunner.tap} for a TLS listener, before the reactor runs, and
Twisted's default HTTPS policy, which arms itself when it first makes a
connection creator.

This is the one module that rewrites Twisted's module globals for TLS;
C{tests/real/test_lazytls.py} compares them with a normal import's and fails
if a Twisted release changes them. A process that loaded pyOpenSSL before
(a test run's reactor) is left as it is.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

#: For each Twisted module that tests for pyOpenSSL at import: its names and what its TLS branch binds.
TLS_NAMES: dict[str, dict[str, tuple[str, str | None]]] = {
    "twisted.internet.endpoints": {
        "SSLError": ("OpenSSL.SSL", "Error"),
        "Certificate": ("twisted.internet.ssl", "Certificate"),
        "CertificateOptions": ("twisted.internet.ssl", "CertificateOptions"),
        "KeyPair": ("twisted.internet.ssl", "KeyPair"),
        "PrivateCertificate": ("twisted.internet.ssl", "PrivateCertificate"),
        "optionsForClientTLS": ("twisted.internet.ssl", "optionsForClientTLS"),
        "trustRootFromCertificates": ("twisted.internet.ssl", "trustRootFromCertificates"),
        "SNIConnectionCreator": ("twisted.protocols._sni", "SNIConnectionCreator"),
        "_TLSServerEndpoint": ("twisted.protocols._sni", "TLSServerEndpoint"),
        "autoReloadingDirectoryOfPEMs": ("twisted.protocols._sni", "autoReloadingDirectoryOfPEMs"),
        "_TLSMemoryBIOFactory": ("twisted.protocols.tls", "TLSMemoryBIOFactory"),
        "TLSMemoryBIOFactory": ("twisted.protocols.tls", "TLSMemoryBIOFactory"),
    },
    "twisted.internet.posixbase": {
        "_tls": ("twisted.protocols.tls", None),
        "tls": ("twisted.protocols.tls", None),
        "_ssl": ("twisted.internet.ssl", None),
        "ssl": ("twisted.internet.ssl", None),
    },
    "twisted.web.client": {
        "SSL": ("OpenSSL.SSL", None),
        "CertificateOptions": ("twisted.internet.ssl", "CertificateOptions"),
        "optionsForClientTLS": ("twisted.internet.ssl", "optionsForClientTLS"),
        "platformTrust": ("twisted.internet.ssl", "platformTrust"),
    },
}
#: Methods twisted.web.client replaces with one raising NotImplementedError when it loads without TLS.
TLS_METHODS = (("BrowserLikePolicyForHTTPS", "creatorForNetloc"), ("WebClientContextFactory", "getContext"))

_deferred = False


def defer() -> None:
    """Keep pyOpenSSL out of the imports from now until L{arm}, unless it is loaded already."""
    global _deferred
    if "OpenSSL" not in sys.modules:
        sys.modules["OpenSSL"] = None  # type: ignore[assignment]
        _deferred = True


def arm() -> None:
    """Load pyOpenSSL, and bind what Twisted's modules loaded without it would have bound with it."""
    global _deferred
    if not _deferred:
        return
    _deferred = False
    del sys.modules["OpenSSL"]
    for module_name, names in TLS_NAMES.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue  # not loaded yet: it will find pyOpenSSL itself
        for name, (source, attribute) in names.items():
            found: Any = importlib.import_module(source)
            setattr(module, name, found if attribute is None else getattr(found, attribute))
    client = sys.modules.get("twisted.web.client")
    if client is not None:
        for class_name, method_name in TLS_METHODS:
            cls = getattr(client, class_name)
            method = vars(cls)[method_name]
            setattr(cls, method_name, getattr(method, "__wrapped__", method))


def _arming(client: ModuleType) -> None:
    """Make twisted.web.client's HTTPS policy arm TLS when it is first asked for a connection creator."""
    policy = client.BrowserLikePolicyForHTTPS
    refusing = vars(policy)["creatorForNetloc"]
    if not hasattr(refusing, "__wrapped__"):
        return  # loaded with TLS

    def creatorForNetloc(self: Any, hostname: bytes, port: int) -> Any:
        arm()
        return policy.creatorForNetloc(self, hostname, port)

    creatorForNetloc.__wrapped__ = refusing.__wrapped__  # type: ignore[attr-defined]
    policy.creatorForNetloc = creatorForNetloc


defer()
if _deferred:
    _arming(importlib.import_module("twisted.web.client"))
