"""What a GGUF file says about itself: architecture, parameter count, quantization, context.

This is what Docker Model Runner puts in a model's config blob, and what the
scheduler's memory estimate starts from. A file is read by a child interpreter
(``python -m mrunner.store.gguf_meta FILE`` prints it as JSON; ``-`` for
FILE reads paths from stdin, one a line, up to an empty line): the ``gguf``
package brings numpy, some 20 MB that would stay resident in the daemon for
good after its first import, for a read of a few hundred milliseconds. The
header is read within bounds (L{mrunner.store.gguf_header}), and the child's
address space is capped (C{RLIMIT_AS}, L{MAX_MEMORY}) besides: a hostile header
costs at most that. Reading waits for the child: call it off the reactor thread.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from mrunner.errors import BadRequest
from mrunner.values.sizes import format_size

if TYPE_CHECKING:
    from mrunner.store.gguf_header import Tensor

#: The reading child's address space (C{RLIMIT_AS}): the interpreter with numpy takes about
#: 250 MiB of it; a header that would take more than the rest is refused, not read.
MAX_MEMORY = 1024 * 1024 * 1024


@attrs.frozen
class GGUFInfo:
    architecture: str
    parameters: int
    quantization: str
    size: int
    context_size: int | None
    metadata: dict[str, str]

    def config(self) -> dict[str, Any]:
        """The ``config`` object of a Docker Model Runner model config blob."""
        config: dict[str, Any] = {
            "format": "gguf",
            "quantization": self.quantization,
            "parameters": format_parameters(self.parameters),
            "architecture": self.architecture,
            "size": format_size(self.size),
            "gguf": self.metadata,
        }
        if self.context_size is not None:
            config["context_size"] = self.context_size
        return config


def read(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read C{path}'s header and tensor table in a child interpreter.

    @raise BadRequest: the file is not a GGUF file.
    """
    return read_all([path])[0]


def read_all(paths: Sequence[str | os.PathLike[str]]) -> list[GGUFInfo]:
    """Read each file's header and tensor table, all in one child interpreter.

    @raise BadRequest: a file is not a GGUF file.
    """
    return Reader().read_all(paths)


class Reader:
    """A child interpreter for one read, started before the files are complete.

    It imports the C{gguf} package (most of a read's time) while the files are
    still being written, then reads the paths it is given on its stdin, one a
    line, up to an empty line.
    """

    def __init__(self) -> None:
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},  # numpy's thread pool, sized to the cores
        )

    def read_all(self, paths: Sequence[str | os.PathLike[str]]) -> list[GGUFInfo]:
        """Each file's L{GGUFInfo}, in order; L{BadRequest} if one is not a GGUF file."""
        self.ask(paths)
        return self.answer()

    def ask(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        """Have the child read C{paths} (whole files, flushed); L{answer} waits for what it found."""
        assert self._child.stdin is not None
        try:
            self._child.stdin.write("".join(os.fspath(path) + "\n" for path in paths) + "\n")
            self._child.stdin.flush()
        except BrokenPipeError:  # the child died: answer says how
            pass

    def answer(self) -> list[GGUFInfo]:
        """What the child read, in order; L{BadRequest} if a file is not a GGUF file."""
        out, err = self._child.communicate()
        if self._child.returncode != 0:
            why = err.strip().splitlines()[-1:] or [f"exit status {self._child.returncode}"]
            raise BadRequest(f"not a valid GGUF file: {why[0]}", code="invalid_gguf")
        return [GGUFInfo(**info) for info in json.loads(out)]

    def close(self) -> None:
        """Stop the child if it was never given a file."""
        if self._child.poll() is None:
            self._child.kill()
            self._child.communicate()


def weights(shards: Sequence[GGUFInfo]) -> GGUFInfo:
    """One model's weights from its files in order: the first's metadata, every file's size and tensors.

    @raise BadRequest: several files that are not one split set (``split.no``,
        ``split.count``), whole and in order, as llama.cpp's ``gguf-split`` writes it.
    """
    first = shards[0]
    if len(shards) > 1 or "split.count" in first.metadata:
        for n, shard in enumerate(shards):
            number, count = shard.metadata.get("split.no"), shard.metadata.get("split.count")
            if number != str(n) or count != str(len(shards)):
                raise BadRequest(
                    f"GGUF file {n + 1} of {len(shards)} says it is shard {number} of {count}"
                    " (split.no, split.count): give every shard of one split model, in order",
                    code="invalid_gguf_shards",
                )
    return attrs.evolve(
        first,
        parameters=sum(shard.parameters for shard in shards),
        size=sum(shard.size for shard in shards),
    )


def of_model(headers: Sequence[GGUFInfo], projector: bool) -> GGUFInfo:
    """The L{weights} of a model from its files' headers in the store's order, the C{projector} last.

    @raise BadRequest: the shards are not one set, or the projector is none (L{check_projector}).
    """
    if projector:
        check_projector(headers[-1])
        headers = headers[:-1]
    return weights(headers)


def check_projector(info: GGUFInfo) -> None:
    """@raise BadRequest: the file is not a llama.cpp vision projector (a ``clip`` GGUF)."""
    if info.architecture != "clip":
        raise BadRequest(
            f"the projector is a GGUF file of architecture {info.architecture!r}, not a multimodal"
            " projector (architecture 'clip', usually named mmproj-*.gguf)",
            code="invalid_mmproj",
        )


def _read(path: str | os.PathLike[str]) -> GGUFInfo:
    from mrunner.store.gguf_header import read_header

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = read_header(f, size)
    metadata = {key: str(value) for key, value in header.metadata.items()}
    architecture = metadata.get("general.architecture", "unknown")
    context = metadata.get(f"{architecture}.context_length")
    return GGUFInfo(
        architecture=architecture,
        parameters=sum(tensor.elements for tensor in header.tensors),
        quantization=_quantization(header.tensors, metadata.get("general.file_type")),
        size=size,
        context_size=int(context) if context is not None else None,
        metadata=metadata,
    )


def _quantization(tensors: Sequence[Tensor], file_type: str | None) -> str:
    """The file type's name (``Q4_K_M``), else the tensor type most weights use."""
    from gguf.constants import GGMLQuantizationType, LlamaFileType

    if file_type is not None:
        try:
            return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    weights: Counter[str] = Counter()
    for tensor in tensors:
        if len(tensor.shape) > 1:  # norms and biases stay F32 whatever the quantization
            weights[GGMLQuantizationType(tensor.type).name] += tensor.elements
    return weights.most_common(1)[0][0] if weights else "unknown"


def format_parameters(count: int) -> str:
    """``361.82 M`` — as Docker Model Runner shows a parameter count."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return str(count)


def main(paths: Sequence[str]) -> int:
    """Print each file's L{GGUFInfo} as a JSON list, or why one is not a GGUF file."""
    try:
        infos = [_read(path) for path in paths]
    except MemoryError:
        print(f"its header needs more than the {format_size(MAX_MEMORY)} a header may take", file=sys.stderr)
        return 1
    except Exception as e:  # a malformed file fails in struct or enum lookups alike
        print(e, file=sys.stderr)
        return 1
    print(json.dumps([attrs.asdict(info) for info in infos]))
    return 0


if __name__ == "__main__":
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MAX_MEMORY, MAX_MEMORY))  # before any header is read
    if sys.argv[1:] == ["-"]:  # L{Reader}: import now, read the paths when they are given
        import mrunner.store.gguf_header  # noqa: F401

        lines = itertools.takewhile(lambda line: line != "\n", sys.stdin)  # up to an empty line
        sys.exit(main([line.removesuffix("\n") for line in lines]))
    sys.exit(main(sys.argv[1:]))
