"""XXH64 and XXH32 (seed 0) of many byte spans of one buffer at once, with numpy.

MinHash hashes every word n-gram of a document. Hashing them one Python call at a time (datatrove
calls ``xxhash`` per shingle string) costs far more than the arithmetic; here every phase of the
algorithms (32-byte stripes, 8-byte lanes, a 4-byte word, single bytes) runs as array operations over
all the spans that need it. The results equal ``xxhash.xxh64_intdigest`` / ``xxh32_intdigest`` of
each span (``tests/pipeline/test_signatures.py`` compares them).
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
BLOCK = 1 << 16
"""Spans hashed per vectorized block: bounds the temporaries to a few MB."""

_Q64 = [
    U64(x)
    for x in (
        11400714785074694791,
        14029467366897019727,
        1609587929392839161,
        9650029242287828579,
        2870177450012600261,
    )
]
_Q32 = [np.uint32(x) for x in (2654435761, 2246822519, 3266489917, 668265263, 374761393)]


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    return (x << x.dtype.type(r)) | (x >> x.dtype.type(bits - r))


class Loader:
    """Little-endian 64-bit words at arbitrary byte offsets of a buffer, each from two aligned
    words (numpy gathers through a stride-1 view are several times slower)."""

    def __init__(self, buf: bytes) -> None:
        padded = np.zeros((len(buf) + 48) // 8 * 8, np.uint8)
        padded[: len(buf)] = np.frombuffer(buf, np.uint8)
        self.bytes = padded
        self.words = padded.view("<u8")

    def u64(self, offsets: np.ndarray) -> np.ndarray:
        q = offsets >> 3
        shift = ((offsets & 7) << 3).astype(U64)
        lo = self.words[q] >> shift
        lo |= self.words[q + 1] << (U64(64) - shift)  # numpy: a shift by 64 gives 0
        return lo


class _Lanes:
    """Consecutive little-endian 64-bit words from byte offsets ``pos`` (one per element), read as
    aligned words: lane m of element i is bytes [pos_i + 8m, pos_i + 8m + 8)."""

    def __init__(self, words: np.ndarray, pos: np.ndarray) -> None:
        self.words, self.q = words, pos >> 3
        self.sh = ((pos & 7) << 3).astype(U64)
        self.inv = U64(64) - self.sh  # numpy: a shift by 64 gives 0
        self.low = words[self.q] >> self.sh  # low part of lane 0

    def next(self, m: int, c: int) -> np.ndarray:
        """Lane m (m = 0, 1, ... in order) of the first c elements; c never grows."""
        hi = self.words[self.q[:c] + (m + 1)]
        lane = self.low[:c] | (hi << self.inv[:c])
        self.low = hi >> self.sh[:c]
        return lane


def xxh64(ld: Loader, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """XXH64 (seed 0) of each span. Each phase of the algorithm (32-byte stripes, 8-byte lanes,
    a 4-byte word, single bytes) runs on the spans that need it, sorted so that they form
    contiguous slices: no masked work, and every aligned word is read once per span."""
    P1, P2, P3, P4, P5 = _Q64
    words = ld.words
    h = np.full(starts.size, P5, U64)
    stripes = lengths >> 5
    if stripes.any():  # 32-byte stripes, most first so that the active ones are a prefix
        order = np.flatnonzero(stripes)
        order = order[np.argsort(-stripes[order], kind="stable")]
        ns = stripes[order]
        lanes = _Lanes(words, starts[order])
        acc = [np.full(order.size, v, U64) for v in (P1 + P2, P2, U64(0), U64(0) - P1)]
        for j in range(int(ns[0])):
            k = int(np.count_nonzero(ns > j))
            for lane in range(4):
                v = acc[lane][:k]
                w = lanes.next(4 * j + lane, k)
                w *= P2
                v += w
                v[:] = _rotl(v, 31) * P1
        hl = _rotl(acc[0], 1) + _rotl(acc[1], 7) + _rotl(acc[2], 12) + _rotl(acc[3], 18)
        for v in acc:
            v *= P2
            v = _rotl(v, 31)
            v *= P1
            hl ^= v
            hl *= P1
            hl += P4
        h[order] = hl
    h += lengths.astype(U64)
    pos = starts + (stripes << 5)
    rem = (lengths & 31).astype(np.uint8)
    n8 = rem >> 3
    if n8.any():  # 8-byte lanes, most first: the active ones are a prefix
        o = np.argsort(np.uint8(3) - n8, kind="stable")
        hs = h[o]
        at_least = np.bincount(n8, minlength=4)[::-1].cumsum()[::-1]
        c = int(at_least[1])
        lanes = _Lanes(words, pos[o[:c]])
        for j in range(3):
            c = int(at_least[j + 1])
            if c == 0:
                break
            k1 = lanes.next(j, c)
            k1 *= P2
            k1 = _rotl(k1, 31)
            k1 *= P1
            hv = hs[:c]
            hv ^= k1
            hv[:] = _rotl(hv, 27) * P1 + P4
        h[o] = hs
        pos = pos + (n8.astype(pos.dtype) << 3)
    low = rem & 7
    if low.any():  # then 4 bytes when low >= 4, then low & 3 single bytes
        o = np.argsort(np.uint8(7) - low, kind="stable")
        hs, ps = h[o], pos[o]
        at_least = np.append(np.bincount(low, minlength=8)[::-1].cumsum()[::-1], 0)
        c4 = int(at_least[4])
        if c4:
            k = ld.u64(ps[:c4]) & U64(0xFFFFFFFF)
            k *= P1
            hv = hs[:c4]
            hv ^= k
            hv[:] = _rotl(hv, 23) * P2 + P3
            ps[:c4] += 4
        for j in range(3):
            for lo, hi in ((5 + j, 7), (1 + j, 3)):  # values of low with more than j single bytes
                a, b = int(at_least[hi + 1]), int(at_least[lo])
                if a < b:
                    k = ld.bytes[ps[a:b] + j].astype(U64)
                    k *= P5
                    hv = hs[a:b]
                    hv ^= k
                    hv[:] = _rotl(hv, 11) * P1
        h[o] = hs
    h ^= h >> U64(33)
    h *= P2
    h ^= h >> U64(29)
    h *= P3
    h ^= h >> U64(32)
    return h


def xxh32(ld: Loader, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """XXH32 (seed 0) of each span, widened to uint64 (what datatrove stores for 32-bit precision).

    As :func:`xxh64`: each phase (16-byte stripes, 4-byte words, single bytes) runs on the spans that
    need it, sorted so that they form a prefix; a 64-bit aligned read gives two 4-byte lanes."""
    P1, P2, P3, P4, P5 = _Q32
    U32 = np.uint32
    h = np.full(starts.size, P5, U32)
    stripes = lengths >> 4
    if stripes.any():  # 16-byte stripes, most first so that the active ones are a prefix
        order = np.flatnonzero(stripes)
        order = order[np.argsort(-stripes[order], kind="stable")]
        ns = stripes[order]
        lanes = _Lanes(ld.words, starts[order])
        acc = [np.full(order.size, v, U32) for v in (P1 + P2, P2, U32(0), U32(0) - P1)]
        for j in range(int(ns[0])):
            k = int(np.count_nonzero(ns > j))
            for half in range(2):
                word = lanes.next(2 * j + half, k)
                for lane, part in (
                    (2 * half, word.astype(U32)),
                    (2 * half + 1, (word >> U64(32)).astype(U32)),
                ):
                    v = acc[lane][:k]
                    part *= P2
                    v += part
                    v[:] = _rotl(v, 13) * P1
        h[order] = _rotl(acc[0], 1) + _rotl(acc[1], 7) + _rotl(acc[2], 12) + _rotl(acc[3], 18)
    h += lengths.astype(U32)  # XXH32 adds the length modulo 2**32
    pos = starts + (stripes << 4)
    rem = (lengths & 15).astype(np.uint8)
    if rem.any():  # then (rem >> 2) 4-byte words and (rem & 3) single bytes, most first
        o = np.argsort(np.uint8(15) - rem, kind="stable")
        hs, ps = h[o], pos[o]
        at_least = np.append(np.bincount(rem, minlength=16)[::-1].cumsum()[::-1], 0)  # rem >= r
        for j in range(3):  # word j exists when rem >= 4 (j + 1)
            c = int(at_least[4 * (j + 1)])
            if c == 0:
                break
            k = ld.u64(ps[:c] + 4 * j).astype(U32)  # the low (first) four bytes
            k *= P3
            hv = hs[:c]
            hv += k
            hv[:] = _rotl(hv, 17) * P4
        ps += (rem[o] & np.uint8(12)).astype(ps.dtype)
        low = rem[o] & np.uint8(3)
        for j in range(3):  # byte j exists when (rem & 3) > j: not a prefix, so masked
            m = low > j
            if not m.any():
                break
            idx = np.flatnonzero(m)
            hv = hs[idx] + ld.bytes[ps[idx] + j].astype(U32) * P5
            hs[idx] = _rotl(hv, 11) * P1
        h[o] = hs
    h ^= h >> U32(15)
    h *= P2
    h ^= h >> U32(13)
    h *= P3
    h ^= h >> U32(16)
    return h.astype(U64)


def span_hashes(buf: bytes, starts: np.ndarray, lengths: np.ndarray, precision: int = 64) -> np.ndarray:
    """XXH64 (``precision`` 64) or XXH32 (32) of ``buf[s : s + n]`` for each start and length, as uint64."""
    loader = Loader(buf)
    fn = xxh64 if precision == 64 else xxh32
    out = np.empty(starts.size, U64)
    with np.errstate(over="ignore"):
        for i in range(0, starts.size, BLOCK):
            out[i : i + BLOCK] = fn(loader, starts[i : i + BLOCK], lengths[i : i + BLOCK])
    return out
