"""A max segment tree with lazy range-add: the memory ledger's per-stage bytes, updated and searched in
O(log n), so prefetch placement stays fast on traces of thousands of layers."""

from __future__ import annotations


class MaxSegTree:
    """Values v[0..n-1]; range add; range max; rightmost index <= r whose value exceeds a threshold."""

    def __init__(self, values: list[int]) -> None:
        self.n = len(values)
        size = 1
        while size < self.n:
            size *= 2
        self.size = size
        self.mx = [float("-inf")] * (2 * size)
        self.lz = [0] * (2 * size)
        for i, v in enumerate(values):
            self.mx[size + i] = v
        for i in range(size - 1, 0, -1):
            self.mx[i] = max(self.mx[2 * i], self.mx[2 * i + 1])

    def _push(self, node: int) -> None:
        z = self.lz[node]
        if z:
            for c in (2 * node, 2 * node + 1):
                self.mx[c] += z
                self.lz[c] += z
            self.lz[node] = 0

    def add(self, lo: int, hi: int, value: int, node: int = 1, nlo: int = 0, nhi: int = -1) -> None:
        """v[lo..hi] += value (inclusive bounds)."""
        if nhi < 0:
            nhi = self.size - 1
        if hi < nlo or nhi < lo or lo > hi:
            return
        if lo <= nlo and nhi <= hi:
            self.mx[node] += value
            self.lz[node] += value
            return
        self._push(node)
        mid = (nlo + nhi) // 2
        self.add(lo, hi, value, 2 * node, nlo, mid)
        self.add(lo, hi, value, 2 * node + 1, mid + 1, nhi)
        self.mx[node] = max(self.mx[2 * node], self.mx[2 * node + 1])

    def rightmost_above(self, r: int, threshold: float, node: int = 1, nlo: int = 0, nhi: int = -1) -> int:
        """The largest index i <= r with v[i] > threshold, or -1."""
        if nhi < 0:
            nhi = self.size - 1
        if nlo > r or self.mx[node] <= threshold:
            return -1
        if nlo == nhi:
            return nlo
        self._push(node)
        mid = (nlo + nhi) // 2
        found = self.rightmost_above(r, threshold, 2 * node + 1, mid + 1, nhi)
        if found >= 0:
            return found
        return self.rightmost_above(r, threshold, 2 * node, nlo, mid)
