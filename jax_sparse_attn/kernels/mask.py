"""Score-tile masks of the SM90 attention kernels (no jax imports).

``HstuMask`` is the HSTU forward's mask of one warpgroup's ``(rows, bn)`` score tile: query
row ``i`` (sequence-relative) sees key column ``j`` when ``j < L_k`` and

* window ``(left, right)``: ``i + off - left <= j <= i + off + right`` (``-1`` = unbounded;
  ``off = L_k - L_q``), or
* ``func`` interval mask (``func_n = 2 t + 1`` endpoints per row, ``mFunc[0, :, row]``):
  ``j < F0`` or ``a_t <= j < e_t`` for one of the ``t`` intervals.

Masked elements are replaced (``select``) by 0 before the score function: masked or
out-of-sequence K rows (which a TMA tile may read from the next sequence) can hold anything,
NaN included, and never reach the output. ``rows(...)`` precomputes each thread's per-row
bounds once per Q tile; ``tile_fully_valid(n0)`` says when a KV tile needs no per-element
work; ``apply(acc_mn, n0)`` masks a tile in place.

``KeyLimitMask`` is the block-sparse forward's mask: in a KV block with ``limit`` valid keys
(``BlockList.valid_keys``: the sequence end or ``block_sizes``), the score columns at or past
``limit`` become ``-inf`` (a select: whatever those K rows hold, NaN included, is dropped);
only blocks with ``limit < bn`` need it. ``apply_causal`` adds the block-sparse causal mask
(bottom-right aligned, key ``j`` visible from query ``i`` iff ``j <= i + S_kv - S_q``) as a
per-row key limit: row ``r`` of the tile keeps the columns ``c < min(limit, row_lim0 + r)``
with ``row_lim0 = i0 + S_kv - S_q + 1 - n0`` (``i0``, ``n0``: the tile's first query row and
first key); only tiles with ``min(limit, row_lim0) < bn`` need it. With packed GQA rows
(``rows_per_pos = r``: ``r`` consecutive rows are the ``r`` query heads of one position) the
limit grows by one every ``r`` rows, ``row_lim0 + r_tile // r``, ``i0`` being the position of
the tile's first row.

``CausalMaskKeyMajor`` is that causal mask on the block-sparse backward's transposed tiles
(rows = keys, columns = queries): key row ``r`` is visible from the query columns
``c >= qlo0 + r`` (``qlo0 = n0 - (S_kv - S_q) - q0``) and only below the key limit; it selects
0 into the P and dS tiles elsewhere. With packed GQA columns (``cols_per_pos = r``) column
``c`` is position ``q0 / r + c // r`` and the rule reads ``c // r >= qlo0 + r_key`` with
``qlo0 = n0 - (S_kv - S_q) - q0 / r``.

``HstuMaskKeyMajor`` is the HSTU mask of the KV-major backward's transposed score tiles
(rows = keys ``j``, columns = queries ``i``; same visibility rule as ``HstuMask``): it
selects 0 into the P and dS tiles (any element types) where a pair is not visible. Window bounds are per key row
(``j - off - right <= i <= j - off + left``); the func endpoints are per query column and are
read from ``mFunc`` column by column (only for query rows inside the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

BIG = 1 << 30


@dataclass(frozen=True)
class HstuMask:
    has_func: bool
    func_n: int  # 1 without a func mask
    bn: int
    tScS: object  # (rows, cols) identity coordinates of this thread's score values

    @property
    def n_rows(self):
        return cute.size(self.tScS, mode=[0])

    @property
    def n_cols(self):
        return cute.size(self.tScS, mode=[1])

    @cute.jit
    def rows(self, mFunc, row0, seq, left, right):
        """Per-row bounds for query rows ``row0 + tScS[r, 0][0]`` of sequence ``seq``."""
        row_lo = cute.make_rmem_tensor((self.n_rows,), Int32)
        row_hi = cute.make_rmem_tensor((self.n_rows,), Int32)
        row_f = cute.make_rmem_tensor((self.n_rows, self.func_n), Int32)
        for r in cutlass.range_constexpr(self.n_rows):
            i = row0 + self.tScS[r, 0][0]
            if cutlass.const_expr(self.has_func):
                # rows past the sequence end are never written: read no metadata for them
                inside = i < seq.seqlen_q
                for t in cutlass.range_constexpr(self.func_n):
                    row_f[r, t] = Int32(0)
                    if inside:
                        row_f[r, t] = Int32(mFunc[0, t, seq.q_start + i])
                row_hi[r] = seq.seqlen_k - 1
            else:
                row_lo[r] = -BIG if left < 0 else i + seq.off - left
                hi = seq.seqlen_k - 1
                if right >= 0:
                    hi = cutlass.min(hi, i + seq.off + right)
                row_hi[r] = hi
        return row_lo, row_hi, row_f

    @cute.jit
    def tile_fully_valid(self, n0, m0, m1, seq, left, right, f0):
        """1 if every (row in [m0, m1), key in [n0, n0 + bn)) pair of the tile is visible."""
        full = Int32(n0 + self.bn <= seq.seqlen_k)
        if cutlass.const_expr(self.has_func):
            full = full * Int32(n0 + self.bn <= f0)
        else:
            if left >= 0:
                full = full * Int32(n0 >= m1 - 1 + seq.off - left)
            if right >= 0:
                full = full * Int32(n0 + self.bn - 1 <= m0 + seq.off + right)
        return full

    @cute.jit
    def apply(self, acc_mn, n0, row_lo, row_hi, row_f):
        for r in cutlass.range_constexpr(self.n_rows):
            for c in cutlass.range_constexpr(self.n_cols):
                j = n0 + self.tScS[0, c][1]
                valid = cutlass.Boolean(False)
                if cutlass.const_expr(self.has_func):
                    valid = j < row_f[r, 0]
                    for t in cutlass.range_constexpr((self.func_n - 1) // 2):
                        valid = valid | ((j >= row_f[r, 2 * t + 1]) & (j < row_f[r, 2 * t + 2]))
                    valid = valid & (j <= row_hi[r])
                else:
                    valid = (j >= row_lo[r]) & (j <= row_hi[r])
                acc_mn[r, c] = acc_mn[r, c] if valid else Float32(0.0)


@dataclass(frozen=True)
class KeyLimitMask:
    tScS: object  # (rows, cols) identity coordinates of this thread's score values

    @cute.jit
    def apply(self, acc_mn, limit):
        for c in cutlass.range_constexpr(cute.size(self.tScS, mode=[1])):
            keep = self.tScS[0, c][1] < limit
            for r in cutlass.range_constexpr(cute.size(self.tScS, mode=[0])):
                acc_mn[r, c] = acc_mn[r, c] if keep else -Float32.inf

    @cute.jit
    def apply_causal(self, acc_mn, limit, row_lim0, rows_per_pos: cutlass.Constexpr = 1):
        """Row ``r`` keeps the key columns ``c < min(limit, row_lim0 + r // rows_per_pos)``
        (``r``, ``c``: the tile coordinates of ``tScS``; ``rows_per_pos``: consecutive rows of
        one query position, the packed GQA group size, 1 otherwise); the others become
        ``-inf``."""
        for r in cutlass.range_constexpr(cute.size(self.tScS, mode=[0])):
            if cutlass.const_expr(rows_per_pos > 1):
                lim = cutlass.min(limit, row_lim0 + self.tScS[r, 0][0] // rows_per_pos)
            else:
                lim = cutlass.min(limit, row_lim0 + self.tScS[r, 0][0])
            for c in cutlass.range_constexpr(cute.size(self.tScS, mode=[1])):
                acc_mn[r, c] = acc_mn[r, c] if self.tScS[0, c][1] < lim else -Float32.inf


@dataclass(frozen=True)
class CausalMaskKeyMajor:
    tScS: object  # (keys, queries) identity coordinates of this thread's score values

    @cute.jit
    def apply(self, p_mn, ds_mn, limit, qlo0, cols_per_pos: cutlass.Constexpr = 1):
        """Keep ``(r, c)`` iff ``r < limit`` and ``c // cols_per_pos >= qlo0 + r``
        (``cols_per_pos``: consecutive query columns of one position, the packed GQA group
        size, 1 otherwise); select 0 elsewhere."""
        for r in cutlass.range_constexpr(cute.size(self.tScS, mode=[0])):
            kr = self.tScS[r, 0][0]
            key_ok = kr < limit
            lo = qlo0 + kr
            for c in cutlass.range_constexpr(cute.size(self.tScS, mode=[1])):
                if cutlass.const_expr(cols_per_pos > 1):
                    ok = key_ok & (self.tScS[0, c][1] // cols_per_pos >= lo)
                else:
                    ok = key_ok & (self.tScS[0, c][1] >= lo)
                p_mn[r, c] = p_mn[r, c] if ok else p_mn.element_type(0.0)
                ds_mn[r, c] = ds_mn[r, c] if ok else ds_mn.element_type(0.0)


@dataclass(frozen=True)
class HstuMaskKeyMajor:
    has_func: bool
    func_n: int  # 1 without a func mask
    tScS: object  # (keys, queries) identity coordinates of this thread's score values

    @cute.jit
    def apply(self, p_mn, ds_mn, n0, m0, seq, left, right, mFunc):
        n_rows = cute.size(self.tScS, mode=[0])
        n_cols = cute.size(self.tScS, mode=[1])
        if cutlass.const_expr(self.has_func):
            for c in cutlass.range_constexpr(n_cols):
                i = m0 + self.tScS[0, c][1]
                inside = i < seq.seqlen_q
                f = cute.make_rmem_tensor((self.func_n,), Int32)
                for t in cutlass.range_constexpr(self.func_n):
                    f[t] = Int32(0)
                    if inside:
                        f[t] = Int32(mFunc[0, t, seq.q_start + i])
                for r in cutlass.range_constexpr(n_rows):
                    j = n0 + self.tScS[r, 0][0]
                    valid = j < f[0]
                    for t in cutlass.range_constexpr((self.func_n - 1) // 2):
                        valid = valid | ((j >= f[2 * t + 1]) & (j < f[2 * t + 2]))
                    valid = valid & (j < seq.seqlen_k)
                    p_mn[r, c] = p_mn[r, c] if valid else p_mn.element_type(0.0)
                    ds_mn[r, c] = ds_mn[r, c] if valid else ds_mn.element_type(0.0)
        else:
            for r in cutlass.range_constexpr(n_rows):
                j = n0 + self.tScS[r, 0][0]
                lo = -BIG if right < 0 else j - seq.off - right
                hi = BIG if left < 0 else j - seq.off + left
                for c in cutlass.range_constexpr(n_cols):
                    i = m0 + self.tScS[0, c][1]
                    valid = (i >= lo) & (i <= hi)
                    p_mn[r, c] = p_mn[r, c] if valid else p_mn.element_type(0.0)
                    ds_mn[r, c] = ds_mn[r, c] if valid else ds_mn.element_type(0.0)
