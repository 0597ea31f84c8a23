"""The KV pool's loops compiled from C (poolkernel.c) on first use and called through ctypes — or nothing.

A virtual-time run of an agent fleet spends about two thirds of its time in the pool's bookkeeping (sim/kvcache.py):
each operation is a dozen numpy passes over a request's thousands of blocks, each pass a call with its own fixed
cost and temporaries. poolkernel.c does each operation in one loop. It is optional: where no C compiler is at hand
(a fresh machine with Python alone), or ``AGENTLOAD_POOL_KERNEL=0`` is set, ``load`` gives None and the pool runs its
numpy code, which gives the same results (tests/test_poolkernel.py compares the two operation by operation).

The shared library is built with ``$CC`` (default ``cc``) into ``$AGENTLOAD_CACHE_DIR`` (default
``$XDG_CACHE_HOME/agentload`` or ``~/.cache/agentload``), named by a hash of the source and the flags, so an edited
source is rebuilt and concurrent processes (pytest-xdist) each write their own temporary file and rename it in place.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from ctypes import addressof, c_char, c_int, c_int64, c_void_p
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger("agentload.sim")

ENV_SWITCH = "AGENTLOAD_POOL_KERNEL"
_SOURCE = Path(__file__).with_name("poolkernel.c")
_FLAGS = ("-O2", "-std=c99", "-shared", "-fPIC")
_COMPILE_TIMEOUT_S = 120.0

# name: (argument types, result type), as poolkernel.c declares them (pointers as addresses).
_SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "al_find_live": ([c_void_p, c_int, c_void_p, c_void_p, c_int64, c_int64, c_void_p], c_int64),
    "al_check": ([c_void_p, c_void_p, c_void_p, c_int64, c_int64], c_int64),
    "al_register": ([c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_int64, c_int64], c_int64),
    "al_insert": ([c_void_p, c_int, c_void_p, c_void_p, c_int64], c_int64),
    "al_take": ([c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_void_p], c_int64),
    "al_free": ([c_void_p, c_void_p, c_int64, c_void_p, c_int64, c_int], c_int64),
    "al_compact": ([c_void_p, c_void_p, c_int64, c_int64, c_void_p], c_int64),
    "al_acquire": ([c_void_p, c_void_p, c_int64], c_int64),
    "al_unacquire": ([c_void_p, c_void_p, c_int64], None),
    "al_chain_hashes": ([c_void_p, c_int64, c_int64, c_int64, c_void_p], None),
    "al_draw_below": ([c_void_p, c_void_p, c_int64, c_int64, c_void_p], None),
}


class PoolKernel:
    """The compiled functions, typed (the pool calls them as attributes: ``kernel.al_take(...)``)."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        for name, (args, result) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = result
            setattr(self, name, fn)
        # Whether al_chain_hashes gives Python's own hash((parent, tuple(block))) here: it copies CPython's int and
        # tuple hashing, which a future Python could change.
        self.hashes_like_python = self._hash_check()
        # Whether al_draw_below draws numpy's Generator.integers(0, high, n): it copies numpy's bounded-integer
        # algorithm, which a future numpy could change.
        self.draws_like_numpy = self._draw_check()

    @staticmethod
    def generator(rng: np.random.Generator) -> tuple[int, int]:
        """The addresses ``al_draw_below`` takes for ``rng``: its bit generator's state and ``next_uint32``."""
        iface = rng.bit_generator.ctypes
        function = ctypes.cast(iface.next_uint32, c_void_p).value
        assert function is not None
        return iface.state_address, function

    def draw_below(self, source: tuple[int, int], high: int, n: int) -> npt.NDArray[np.int64]:
        """``rng.integers(0, high, n)`` for ``source = generator(rng)``, 1 < high < 2**32: the same tokens, and the
        generator's state moved on as numpy's call would move it."""
        out = np.empty(n, dtype=np.int64)
        self.al_draw_below(source[0], source[1], high, n, address(out))
        return out

    def _draw_check(self) -> bool:
        for seed in (0, 7, 2026):
            ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
            source = self.generator(ours)
            for i, (high, n) in enumerate(
                [(151_936, 400), (2, 33), (3, 1), (151_936, 1_801), (1_000, 0), (2**31 + 11, 257), (2**32 - 1, 64)]
            ):
                # Every other call through numpy on both: the state each leaves must be the other's.
                got = self.draw_below(source, high, n) if i % 2 == 0 else ours.integers(0, high, n)
                if got.tolist() != numpys.integers(0, high, n).tolist():
                    log.info("the C token draw differs from this numpy's; tokens are drawn by numpy")
                    return False
            if ours.bit_generator.state != numpys.bit_generator.state:
                log.info("the C token draw leaves a different generator state than numpy's; tokens are drawn by numpy")
                return False
        return True

    def _hash_check(self) -> bool:
        edges = [0, 1, 7, 151_935, 2**61 - 2, 2**61 - 1, 2**61, 2**62 + 5, 2**63 - 1, -1, -2, -(2**61) + 1, -(2**63)]
        rng = np.random.default_rng(2026)
        tokens = np.concatenate((np.array(edges * 4, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 204)))
        tokens = np.concatenate((tokens, rng.integers(0, 200_000, 512)))
        for block_size, parent in [(16, 0x5EED_0F_A6E17), (4, -2), (1, 2**63 - 1), (16, -(2**63)), (64, 12345)]:
            count = len(tokens) // block_size
            out = np.empty(count, dtype=np.int64)
            self.al_chain_hashes(tokens.ctypes.data, count, block_size, parent, out.ctypes.data)
            expected = []
            for b in range(count):
                parent = hash((parent, tuple(tokens[b * block_size : (b + 1) * block_size].tolist())))
                expected.append(parent)
            if out.tolist() != expected:
                log.info("the C block hash differs from this Python's hash(); block hashes stay in Python")
                return False
        return True

    # Declared for the type checker; set in __init__.
    al_find_live: Callable[..., Any]
    al_check: Callable[..., Any]
    al_register: Callable[..., Any]
    al_insert: Callable[..., Any]
    al_take: Callable[..., Any]
    al_free: Callable[..., Any]
    al_compact: Callable[..., Any]
    al_acquire: Callable[..., Any]
    al_unacquire: Callable[..., Any]
    al_chain_hashes: Callable[..., Any]
    al_draw_below: Callable[..., Any]


def address(array: Any) -> int:
    """The address of a C-contiguous array's first element, for the kernel (which reads it as one).

    Through ctypes' buffer view (a quarter of ``array.ctypes.data``'s cost: a long run asks ~200,000 times), which
    also refuses an array that is not contiguous; an empty or read-only one takes numpy's way."""
    try:
        return addressof(c_char.from_buffer(array))
    except (TypeError, ValueError):
        assert array.flags.c_contiguous, "the pool kernel reads arrays element after element"
        at: int = array.ctypes.data
        return at


def cache_dir() -> Path:
    explicit = os.environ.get("AGENTLOAD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentload"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def library_path(directory: Path | None = None) -> Path:
    """Where the library for this source, compiler and flags lives (built or not)."""
    key = hashlib.sha256()
    key.update(_SOURCE.read_bytes())
    key.update(repr((_compiler(), _FLAGS, platform.machine(), platform.system())).encode())
    return (directory or cache_dir()) / f"poolkernel-{key.hexdigest()[:16]}.so"


def build(directory: Path | None = None) -> Path:
    """Compile poolkernel.c unless already built; the library's path. OSError or CalledProcessError if it cannot."""
    target = library_path(directory)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [*_compiler(), *_FLAGS, "-o", tmp, str(_SOURCE)],
            check=True,
            capture_output=True,
            timeout=_COMPILE_TIMEOUT_S,
        )
        os.replace(tmp, target)  # atomic: another process loading it sees a whole file or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_loaded: dict[Path | None, PoolKernel | None] = {}


def load(directory: Path | None = None) -> PoolKernel | None:
    """The kernel, built if need be; None when switched off or when it cannot be built or loaded (then the pool's
    numpy code runs, with the same results). Tried once per process and directory."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in {"0", "off", "no", "false"}:
        return None
    if directory in _loaded:
        return _loaded[directory]
    kernel: PoolKernel | None = None
    try:
        path = build(directory)
        kernel = PoolKernel(ctypes.CDLL(str(path)), path)
    # RuntimeError: no home directory to cache in; ValueError: a $CC that is not a command line (unbalanced quotes)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError, AttributeError) as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) else ""
        log.info(
            "the KV pool's C kernel is not available (%s%s); using its numpy code", exc, f": {detail}" * bool(detail)
        )
    _loaded[directory] = kernel
    return kernel


def describe(kernel: PoolKernel | None) -> str:
    """One line for benchmark output: which code ran the pool."""
    return f"C kernel ({kernel.path})" if kernel is not None else "numpy (no C kernel)"
