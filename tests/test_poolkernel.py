"""The KV pool's C kernel (sim/poolkernel.c) against the pool's numpy code: the same operations give the same results
and leave the same state, block for block; and without a compiler the pool runs its numpy code."""

from __future__ import annotations

import ctypes
import logging
import random
import shutil
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from agentload.capacity.profile import load_profile, parse_profile
from agentload.sim import poolkernel
from agentload.sim.hashchain import HashChain
from agentload.sim.kvcache import BlockTable, KVCacheManager
from agentload.sim.tokens import VOCAB_SIZE, block_hashes, extend_block_hashes, extend_block_hashes_array
from agentload.sim.virtual import SessionShape, run_sessions
from tests.test_kvcache import HYBRID

BS = 16

DENSE = HYBRID.replace('attention = "hybrid"\nsliding_window = 64\nnum_sliding_layers = 6\n', "")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> poolkernel.PoolKernel:
    """The kernel compiled from its source into a directory of its own (no library built before is used)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine: the pool runs its numpy code")
    kernel = poolkernel.load(tmp_path_factory.mktemp("kernel"))
    assert kernel is not None, "a C compiler is here, yet the kernel did not build"
    return kernel


def _compactions(kv: KVCacheManager) -> list[int]:
    """Count the free queue's compactions in ``kv`` (an append that does not fit behind the tail)."""
    seen = [0]
    make_room = kv._make_room

    def counted(n: int) -> None:
        seen[0] += kv._tail + n > len(kv._queue)
        make_room(n)

    kv._make_room = counted  # type: ignore[method-assign]
    return seen


def _rebuilds(kv: KVCacheManager) -> list[int]:
    seen = [0]
    rebuild = kv._rebuild

    def counted(gi: int) -> None:
        seen[0] += 1
        rebuild(gi)

    kv._rebuild = counted  # type: ignore[method-assign]
    return seen


def _state(kv: KVCacheManager) -> tuple[object, ...]:
    """Everything the pool's results depend on (the hash index by what it finds, not by where its keys sit)."""
    live = kv._queue[kv._head : kv._tail]
    return (
        kv._ref.tolist(),
        kv._stamp.tolist(),
        kv._key_hash.tolist(),
        kv._key_group.tolist(),
        live.tolist(),
        kv._head,
        kv._tail,
        len(kv._queue),
        kv.num_free,
        kv.stats,
        list(kv._offload),
        {g: index.used for g, index in kv._index.items()},
    )


@pytest.mark.parametrize(("layout_text", "offload"), [(DENSE, 0), (HYBRID, 0), (DENSE, 300)])
def test_the_kernel_and_the_numpy_code_leave_the_same_pool(
    built: poolkernel.PoolKernel, monkeypatch: pytest.MonkeyPatch, layout_text: str, offload: int
) -> None:
    """Random agents' turns on a small pool: lookups (remembered walks and probes), allocations with and without
    hits, caching at once and block by block, frees; evictions, queue compactions and index rebuilds all happen.
    Every result and the whole state agree after every operation."""
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: built)
    layout = parse_profile(layout_text, "pool").layout
    rng = random.Random(11)
    managers = [
        KVCacheManager(layout, 700, use_kernel=use, offload_blocks=offload * len(layout.groups))
        for use in (False, True)
    ]
    assert managers[0]._k is None
    assert managers[1]._k is built
    compactions = [_compactions(kv) for kv in managers]
    shared = [7] * 150 * BS
    chains = [block_hashes([c * 100_003 + i for i in range(rng.randrange(20, 400) * BS)], BS) for c in range(40)]
    chains += [block_hashes(shared + [c] * rng.randrange(10, 250) * BS, BS) for c in range(6)]
    holding: list[list[BlockTable]] = [[] for _ in managers]
    for _ in range(700):
        c = chains[rng.randrange(len(chains))]
        limit = rng.randrange(1, len(c) + 1)
        tokens = rng.randrange(1, limit + 2) * BS
        grow = rng.randrange(0, 4 * BS)
        one_by_one = rng.random() < 0.2
        keep = rng.randrange(1, 5)
        drop = [rng.random() for _ in range(3)]
        outcomes = []
        for kv, held in zip(managers, holding, strict=True):
            found = kv.lookup(c, limit)
            seen: list[object] = [found.num_hit_blocks, found.offload_blocks, [b.tolist() for b in found.hit_blocks]]
            seen.append(kv.blocks_needed(kv.new_table(), tokens, found))
            table = kv.new_table()
            hit = found.num_hit_blocks + found.offload_blocks
            fits = hit * BS < tokens and kv.allocate(table, tokens, found)
            seen.append(fits)
            if fits:
                if found.offload_blocks:
                    kv.note_offload_load(c, found.num_hit_blocks, found.offload_blocks)
                full = min(tokens // BS, len(c))
                if one_by_one:
                    for i in range(found.num_hit_blocks, full):
                        kv.register(table, c, i, i + 1)
                else:
                    kv.register(table, c, found.num_hit_blocks, full)
                seen.append(kv.allocate(table, tokens + grow))  # a decoder growing block by block
                held.append(table)
            for x in drop:
                if len(held) > keep:
                    kv.free(held.pop(int(x * len(held))))
            seen.append([[blocks.tolist() for blocks in t] for t in held])
            outcomes.append(seen)
        assert outcomes[0] == outcomes[1]
        assert _state(managers[0]) == _state(managers[1])
    for kv in managers:
        kv.check_invariants()
    assert managers[0].stats.evicted_blocks > 5_000
    assert compactions[0] == compactions[1]
    assert compactions[0][0] > 0
    if offload:
        assert managers[0].stats.offload_loaded_blocks > 0


def test_an_index_rebuild_keeps_what_it_finds(built: poolkernel.PoolKernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool whose index fills with stale entries (every block evicted again and again under new hashes) is
    rebuilt from its live entries, by the kernel as by numpy."""
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: built)
    layout = parse_profile(DENSE, "pool").layout
    managers = [KVCacheManager(layout, 64, use_kernel=use) for use in (False, True)]
    bits = [kv._index[0]._bits for kv in managers]
    rebuilds = [_rebuilds(kv) for kv in managers]
    for c in range(400):
        hashes = block_hashes([c * 7_919 + i for i in range(20 * BS)], BS)
        for kv in managers:
            table = kv.new_table()
            assert kv.allocate(table, len(hashes) * BS)
            kv.register(table, hashes, 0, len(hashes))
            kv.free(table)
        assert _state(managers[0]) == _state(managers[1])
        assert [kv.lookup(hashes, 20).num_hit_blocks for kv in managers] == [20, 20]
    assert rebuilds[0] == rebuilds[1]
    assert rebuilds[0][0] > 5
    for kv, before in zip(managers, bits, strict=True):
        kv.check_invariants()
        assert kv._index[0]._bits == before  # rebuilt in place (only live entries kept), not grown
        assert kv._index[0].used < 400 * 20


def _curve(profile_name: str, sessions: int, growth: Literal["hold", "grow"]) -> object:
    # (A growing conversation of at most 12k tokens restarts every ~6 turns: some restart within the run.)
    shape = SessionShape(context=40_000 if growth == "hold" else 12_000, growth=growth)
    return run_sessions(load_profile(profile_name), sessions, shape, duration_s=120, warmup_s=30)


@pytest.mark.parametrize(
    ("profile_name", "sessions", "growth"),
    [("qwen3-235b-gb300", 28, "hold"), ("deepseek-sliding-gb300", 40, "hold"), ("qwen3-235b-gb300", 28, "grow")],
)
def test_a_virtual_run_is_the_same_with_the_kernel_and_without(
    built: poolkernel.PoolKernel,
    monkeypatch: pytest.MonkeyPatch,
    profile_name: str,
    sessions: int,
    growth: Literal["hold", "grow"],
) -> None:
    """Past the dense knee (evictions, preemptions, recomputation) and on sliding-window groups; and conversations
    that grow and restart (their tokens drawn and their replies hashed ahead in C, or by numpy and Python): the
    whole result, every float and every TTFT, is the same bit for bit."""
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: built)
    with_kernel = _curve(profile_name, sessions, growth)
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: None)
    assert with_kernel == _curve(profile_name, sessions, growth)


def test_the_switch_turns_a_built_kernel_off(built: poolkernel.PoolKernel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(poolkernel.ENV_SWITCH, "0")
    assert poolkernel.load(built.path.parent) is None
    monkeypatch.setenv(poolkernel.ENV_SWITCH, "1")
    assert poolkernel.load(built.path.parent) is built


def test_without_a_compiler_the_pool_runs_its_numpy_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.INFO, logger="agentload.sim"):
        assert poolkernel.load(tmp_path / "cache") is None
    assert "numpy" in caplog.text
    assert not list((tmp_path / "cache").glob("*.so*"))  # no half-written library left behind
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: None)
    kv = KVCacheManager(parse_profile(DENSE, "pool").layout, 8)
    assert kv._k is None
    table = kv.new_table()
    assert kv.allocate(table, 5 * BS)
    assert kv.num_free == 3
    assert poolkernel.describe(None) == "numpy (no C kernel)"


def test_a_cc_that_is_not_a_command_line_leaves_the_numpy_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "gcc 'unbalanced")
    assert poolkernel.load(tmp_path / "cache") is None


def test_a_compiler_that_fails_leaves_the_numpy_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'error: nope' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    assert poolkernel.load(tmp_path / "cache") is None
    assert not list((tmp_path / "cache").glob("*.so*"))


def test_the_library_is_named_by_its_source_and_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    plain = poolkernel.library_path(tmp_path)
    monkeypatch.setenv("CC", "clang")
    assert poolkernel.library_path(tmp_path) != plain
    assert plain.parent == tmp_path
    monkeypatch.setenv("AGENTLOAD_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert poolkernel.library_path().parent == tmp_path / "elsewhere"


def test_a_built_library_is_reused(built: poolkernel.PoolKernel) -> None:
    assert poolkernel.build(built.path.parent) == built.path
    assert poolkernel.load(built.path.parent) is built
    assert "C kernel" in poolkernel.describe(built)
    assert np.dtype(np.int32).itemsize == 4  # the kernel's block ids are int32, its rows int64


def test_block_hashes_from_an_array_are_pythons_own(
    built: poolkernel.PoolKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's tokens hashed in C, from any covered point and offset, give ``extend_block_hashes``'s
    Python values, which every prefix lookup compares; the same without the kernel."""
    assert built.hashes_like_python
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, VOCAB_SIZE, 3_000)
    for kernel in (built, None):
        monkeypatch.setattr(poolkernel, "load", lambda directory=None, kernel=kernel: kernel)
        for covered_blocks, offset, stop in [(0, 0, 3_000), (5, 80, 2_999), (5, 40, 95), (7, 0, 127), (0, 0, 15)]:
            start = block_hashes(tokens[:stop].tolist(), BS)[:covered_blocks]
            expected = extend_block_hashes(list(start), tokens[offset:stop].tolist(), BS, offset=offset)
            got = extend_block_hashes_array(list(start), tokens[offset:stop], BS, offset=offset)
            assert got == expected
            assert len(got) == max(covered_blocks, stop // BS)
            # A conversation's HashChain takes them into its int64 mirror too (in C: straight into it), whether
            # its mirror covered all of it, part of it or none before.
            for mirrored in {0, covered_blocks // 2, covered_blocks}:
                chain = HashChain(start)
                chain.array(mirrored)
                assert extend_block_hashes_array(chain, tokens[offset:stop], BS, offset=offset) is chain
                assert chain == expected
                assert chain.array(len(chain)).tolist() == expected


def test_a_c_hash_unlike_pythons_is_not_used(built: poolkernel.PoolKernel) -> None:
    """The load-time check catches a C hash that differs from this Python's (say, a future tuple hash)."""
    kernel = poolkernel.PoolKernel(ctypes.CDLL(str(built.path)), built.path)
    assert kernel.hashes_like_python
    chain = kernel.al_chain_hashes

    def off_by_one(tokens: int, count: int, block_size: int, parent: int, out: int) -> None:
        chain(tokens, count, block_size, parent + 1, out)

    kernel.al_chain_hashes = off_by_one
    assert not kernel._hash_check()


def test_tokens_drawn_in_c_are_numpys_and_leave_its_generator_where_numpy_would(built: poolkernel.PoolKernel) -> None:
    """A session's tokens (``Generator.integers(0, high, n)``) drawn in C: the same tokens, and the same generator
    state after, so numpy's next draw on it is the same too; a high bound near 2**32 rejects about half its draws."""
    assert built.draws_like_numpy
    for high in (151_936, 2, 2**31 + 1, 2**32 - 1):
        ours, numpys = np.random.default_rng(high), np.random.default_rng(high)
        source = built.generator(ours)
        assert built.draw_below(source, high, 3_001).tolist() == numpys.integers(0, high, 3_001).tolist()
        assert ours.integers(0, high, 5).tolist() == numpys.integers(0, high, 5).tolist()
        assert built.draw_below(source, high, 7).tolist() == numpys.integers(0, high, 7).tolist()
        assert ours.bit_generator.state == numpys.bit_generator.state


def test_a_c_draw_unlike_numpys_is_not_used(built: poolkernel.PoolKernel) -> None:
    """The load-time check catches a C draw that differs from this numpy's (say, a future bounded-integer method)."""
    kernel = poolkernel.PoolKernel(ctypes.CDLL(str(built.path)), built.path)
    assert kernel.draws_like_numpy
    draw = kernel.al_draw_below

    def one_high(state: int, function: int, high: int, n: int, out: int) -> None:
        draw(state, function, high + 1, n, out)

    kernel.al_draw_below = one_high
    assert not kernel._draw_check()


@pytest.mark.parametrize(("use_kernel", "offload"), [(False, 0), (True, 0), (False, 300), (True, 300)])
def test_growing_many_decoders_at_once_takes_what_one_at_a_time_would(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, use_kernel: bool, offload: int
) -> None:
    """``grow_one_each`` (the engine's members at a block boundary, one pass over the free queue) against one
    ``allocate`` after another: the same blocks to the same requests, the same evictions (to the offload tier in
    the same order), the same pool, on a pool whose free queue holds cached blocks and stale entries. The numpy
    pool's cases need no compiler."""
    built = request.getfixturevalue("built") if use_kernel else None
    monkeypatch.setattr(poolkernel, "load", lambda directory=None: built)
    layout = parse_profile(DENSE, "pool").layout
    rng = random.Random(5)
    pools = [KVCacheManager(layout, 400, use_kernel=use_kernel, offload_blocks=offload) for _ in range(2)]
    assert pools[0].single_group
    assert all(kv._k is built for kv in pools)
    chains = [block_hashes([c * 7_919 + i for i in range(rng.randrange(4, 40) * BS)], BS) for c in range(30)]
    decoders: list[list[BlockTable]] = [[], []]
    grown = 0
    for _ in range(300):
        c = chains[rng.randrange(len(chains))]
        free_some = rng.random() < 0.4
        batch = rng.randrange(1, 9)
        for kv, held in zip(pools, decoders, strict=True):
            found = kv.lookup(c, len(c) - 1)
            table = kv.new_table()
            tokens = len(c) * BS
            if kv.allocate(table, tokens, found):
                kv.register(table, c, found.num_hit_blocks, len(c))
                held.append(table)
            if free_some and len(held) > 3:
                kv.free(held.pop(0))  # its blocks stay cached, at the back of the free queue
            # The newest decoders reach a block boundary together: each needs one block more.
            due = held[-batch:]
            if len(due) > kv.num_free:
                continue
            if kv is pools[0]:
                for t in due:
                    assert kv.allocate(t, len(t[0]) * BS + 1)
            else:
                kv.grow_one_each([t[0] for t in due])
                grown += len(due)
        tables = [[t[0].tolist() for t in held] for held in decoders]
        assert tables[0] == tables[1]
        assert _state(pools[0]) == _state(pools[1])
    assert grown > 500
    assert pools[0].stats.evicted_blocks > 300
    if offload:
        assert pools[0].stats.offload_stored_blocks > 300
    for kv in pools:
        kv.check_invariants()


def test_an_arrays_address_is_numpys_and_a_strided_one_is_refused() -> None:
    _at = poolkernel.address
    blocks = np.arange(40, dtype=np.int32)
    assert _at(blocks) == blocks.ctypes.data
    assert _at(blocks[8:]) == blocks.ctypes.data + 32
    empty, frozen = np.zeros(0, dtype=np.int32), np.frombuffer(b"\x01\x00\x00\x00" * 4, dtype=np.int32)
    assert _at(empty) == empty.ctypes.data  # (no buffer to view: numpy's own way)
    assert _at(frozen) == frozen.ctypes.data  # read-only
    with pytest.raises(AssertionError, match="element after element"):
        _at(blocks[::2])
