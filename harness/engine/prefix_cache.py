"""Prefix caching with vLLM v1's semantics: a hash chain over full KV blocks, ref-counted blocks
and an LRU of cached blocks nobody holds (anchors-engines.md §1.6; vLLM
``v1/core/kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``).

- A block's hash is ``hash((parent_hash, the block's tokens))``; only FULL blocks are hashed
  (vLLM ``hash_block_tokens``), so a hit is always a whole number of blocks.
- A request's tokens are named by a :class:`PromptIdentity`: the simulator has no token ids, so
  a prompt is a sequence of named token runs (``("system:ab12", 300), ("s7/u0", 40), ...``);
  two prompts share a block iff the block covers the same runs at the same offsets. The
  server, which has token ids, uses :meth:`PromptIdentity.from_token_ids`. Generated tokens
  continue the stream as the run ``reply_key``, so a later prompt that holds the reply (the
  next turn's history) names the same blocks.
- Free blocks form vLLM's free queue: never-cached blocks first (vLLM ``free_blocks`` prepends
  them: LIFO reuse), then cached blocks nobody holds, least recently freed first. A new block
  comes from the head, so a cached block is evicted only when no never-cached block is free.
  Only the cached part needs identities here: :class:`PrefixCache` keeps it in an
  ``OrderedDict`` (O(1) hit, free and evict); the engine core counts the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import count

_ROOT = hash("harness-prefix-root")
_fresh = count()


class PromptIdentity:
    """What a request's tokens are, block by block (the hash chain), without token ids.

    ``runs`` is the prompt as ``(key, length)`` named runs or tuples of token ids; generated
    tokens continue as the run ``reply_key`` (a fresh key per identity when None: its
    blocks are then reused only by the same request after a preemption, like vLLM).
    """

    __slots__ = ("_runs", "reply_key", "num_prompt_tokens", "_hash_bs", "_hashes", "_cursor")

    def __init__(self, runs: list[tuple[object, int]], reply_key: object | None = None) -> None:
        self._runs = runs
        self.reply_key = reply_key if reply_key is not None else ("gen", next(_fresh))
        self.num_prompt_tokens = sum(n for _, n in runs)
        self._hash_bs = 0
        self._hashes: list[int] = []
        self._cursor = (0, 0, _ROOT)  # (run index, offset in run, parent hash)

    @classmethod
    def from_segments(
        cls, segments: Sequence[tuple[str, int]], reply_key: str | None = None
    ) -> PromptIdentity:
        """A prompt made of named token runs, e.g. system prefix, history turns, new text."""
        runs: list[tuple[object, int]] = []
        for key, n in segments:
            n = int(n)
            if n < 0:
                raise ValueError(f"segment {key!r} has a negative length {n}")
            if n:
                runs.append((str(key), n))
        return cls(runs, reply_key)

    @classmethod
    def from_token_ids(cls, ids: Sequence[int], reply_key: str | None = None) -> PromptIdentity:
        """A prompt given as token ids (the built-in server tokenizes its prompts)."""
        t = tuple(int(i) for i in ids)
        return cls([(t, len(t))] if t else [], reply_key)

    def block_hashes(self, block_size: int, n_blocks: int) -> list[int]:
        """Hashes of the first ``n_blocks`` full blocks of the token stream (prompt, then the
        reply run), computed once and extended lazily (vLLM ``hash_request_tokens``)."""
        if block_size != self._hash_bs:
            self._hash_bs = block_size
            self._hashes = []
            self._cursor = (0, 0, _ROOT)
        hashes = self._hashes
        if len(hashes) >= n_blocks:
            return hashes
        runs = self._runs
        ri, off, parent = self._cursor
        while len(hashes) < n_blocks:
            need = block_size
            pieces: list[object] = []
            while need:
                if ri < len(runs):
                    key, n = runs[ri]
                    take = min(need, n - off)
                    if isinstance(key, tuple):  # token ids
                        pieces.append(key[off : off + take])
                    else:
                        pieces.append((key, off, take))
                    off += take
                    if off == n:
                        ri, off = ri + 1, 0
                else:  # generated tokens: the reply run, unbounded
                    take = need
                    pieces.append((self.reply_key, off, take))
                    off += take
                need -= take
            parent = hash((parent, tuple(pieces)))
            hashes.append(parent)
        self._cursor = (ri, off, parent)
        return hashes

    def __repr__(self) -> str:
        return f"PromptIdentity({self.num_prompt_tokens} tokens, reply={self.reply_key!r})"


class PrefixCache:
    """The cached blocks of one engine: hash -> block, ref counts, and the LRU of cached blocks
    with no holder (the tail of vLLM's free queue). The engine core owns the block counts;
    this class never scans all blocks (every operation is O(blocks touched))."""

    __slots__ = (
        "by_hash",
        "hash_of",
        "ref",
        "lru",
        "_ids",
        "queries",
        "hits",
        "preempted_queries",
        "preempted_hits",
        "evictions",
    )

    def __init__(self) -> None:
        self.by_hash: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # free cached blocks, evict-first first
        self._ids = count()
        self.queries = 0  # prompt tokens looked up at admission (vLLM prefix_cache_queries)
        self.hits = 0  # of which found cached (vLLM prefix_cache_hits)
        self.preempted_queries = 0  # the same for re-admissions after a preemption
        self.preempted_hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        """Blocks cached (held or free)."""
        return len(self.hash_of)

    def longest_hit(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix, at most ``max_blocks`` long."""
        out: list[int] = []
        by = self.by_hash
        for i in range(min(max_blocks, len(hashes))):
            b = by.get(hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def num_free_of(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` nobody holds (a hit on them takes blocks from the free queue)."""
        ref = self.ref
        return sum(1 for b in ids if ref[b] == 0)

    def touch(self, ids: Sequence[int]) -> None:
        """A request holds ``ids`` (a hit): ref += 1, leaving the free queue (vLLM ``touch``)."""
        ref, lru = self.ref, self.lru
        for b in ids:
            if ref[b] == 0:
                del lru[b]
            ref[b] += 1

    def add(self, h: int) -> int:
        """A request's block just became full with hash ``h``: cache it (ref 1). When the hash
        is cached already (two requests computed the same block) the first block stays the
        one found by lookups (vLLM keeps both; lookups take either)."""
        b = next(self._ids)
        self.hash_of[b] = h
        self.ref[b] = 1
        self.by_hash.setdefault(h, b)
        return b

    def release(self, ids: Sequence[int]) -> int:
        """A request lets go of its cached blocks; those nobody else holds join the LRU tail in
        reverse order (vLLM frees a request's blocks tail first, so its later blocks are
        evicted first). Returns how many became free."""
        ref, lru = self.ref, self.lru
        freed = 0
        for b in reversed(ids):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                lru[b] = None
                freed += 1
        return freed

    def evict(self, n: int) -> None:
        """Evict ``n`` free cached blocks from the LRU head (a new block was needed)."""
        lru, by, hash_of, ref = self.lru, self.by_hash, self.hash_of, self.ref
        for _ in range(n):
            b, _v = lru.popitem(last=False)
            h = hash_of.pop(b)
            del ref[b]
            if by.get(h) == b:
                del by[h]
        self.evictions += n

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Hit counters at admission, split like vLLM's ``PrefixCacheStats.record``."""
        if preempted:
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """hits / queries over first admissions (vLLM's prefix cache hit rate); NaN if none."""
        return self.hits / self.queries if self.queries else float("nan")


__all__ = ["PrefixCache", "PromptIdentity"]
