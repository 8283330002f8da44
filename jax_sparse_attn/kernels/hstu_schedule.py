"""HSTU tile schedules on the GPU in one launch (CuTe DSL, no jax imports).

One CTA of 1024 threads turns the raw ``cu_seqlens_q`` / ``cu_seqlens_k`` of a call into
what the HSTU kernels read, everything in shared memory:

* the sanitised offsets (``metadata.sanitize_cu_seqlens`` + ``append_pseudo_sequence``):
  ``cu[0] = 0``, every entry clamped to ``[0, total]`` and made non-decreasing (a running
  max, Hillis-Steele scan), plus one pseudo-sequence. Forward: ``cu_q[B + 1] = T_q`` (rows
  past ``cu_q[B]`` belong to it and get zeros), ``cu_k[B + 1] = cu_k[B]`` (no keys);
  backward: the other way round (keys past ``cu_k[B]`` get zero dk/dv).
* forward (``HstuSchedule(block_m)``): the schedule rows ``[batch, m_block, 0, 0, 0]`` of
  every query tile of ``block_m`` rows (``batch = -1``: idle slot), longest processing
  time first: a tile's work is the number of keys its window lets it see, in units of 64
  keys, plus one (the window arithmetic of ``metadata.hstu_fwd_schedule``); ties keep the
  canonical order.
* backward (``HstuSchedule(block_n, kv_major=True, block_other=block_m)``): the KV tiles
  ``[batch, n_block]`` of ``block_n`` keys, longest work first (``sort``; the number of
  query rows the window lets see the tile, as ``metadata.hstu_bwd_schedule``) or in
  canonical order, and ``q_start`` (B + 2,): each sequence's first canonical query tile of
  ``block_m`` rows.

The order is a bitonic sort of 32-bit keys ``(2^17 - 1 - work) << 14 | canonical index``
in shared memory.

The XLA formulation of the same schedule costs about ten small kernels (a sort, scans,
gathers, concatenations); this is one. Limits (static, checked by the caller): at most
``MAX_SEQS`` sequences incl. the pseudo-sequence and ``MAX_SLOTS`` schedule rows; a
``func`` mask needs the per-tile interval summary and keeps the XLA path.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .common import launch, smem_storage

NUM_THREADS = 1024
MAX_SEQS = 1024  # sequences incl. the pseudo-sequence (one scan element per thread)
MAX_SLOTS = 8192  # schedule rows (sort keys in shared memory)
_IDX_BITS = 14  # canonical index bits of a sort key (MAX_SLOTS <= 2^14)
_WORK_MAX = (1 << 17) - 1  # work (64-key units) saturates here
_IDLE = 0x7FFFFFFF  # the key of an idle slot: sorts last


class HstuSchedule:
    def __init__(self, block: int, kv_major: bool = False, block_other: int = 0,
                 sort: bool = True):
        self.bm = block
        self.kv_major = kv_major
        self.block_other = block_other
        self.sort = sort

    @cute.jit
    def __call__(self, mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, stream):
        """``mCuQ``/``mCuK`` (B + 1,) raw offsets; ``mParam`` int32 ``[T_q, T_k, left, right,
        n_slots, n_pow2]`` (``n_pow2``: a power of two >= ``n_slots``); outputs ``mCuQs``,
        ``mCuKs`` (B + 2,), ``mTile`` (n_slots, 5) forward / (n_slots, 2) backward and (backward)
        ``mQStart`` (B + 2,)."""

        @cute.struct
        class Smem:
            keys: cute.struct.MemRange[Int32, MAX_SLOTS]
            cq: cute.struct.MemRange[Int32, MAX_SEQS]
            ck: cute.struct.MemRange[Int32, MAX_SEQS]
            start: cute.struct.MemRange[Int32, MAX_SEQS]
            qstart: cute.struct.MemRange[Int32, MAX_SEQS]

        launch(self.kernel(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem), (1, 1, 1),
               NUM_THREADS, Smem, stream)

    @cute.jit
    def _scan(self, buf, tid, n, is_max: cutlass.Constexpr):
        """Inclusive scan (running max or sum) of ``buf[0:n]`` in place, one element per
        thread (``n <= NUM_THREADS``), Hillis-Steele: every step reads, then a CTA barrier,
        then writes."""
        step = 1
        for _ in cutlass.range_constexpr(10):  # 2^10 = MAX_SEQS
            v = Int32(0)
            if tid < n:
                v = buf[tid]
                if tid >= step:
                    w = buf[tid - step]
                    if cutlass.const_expr(is_max):
                        v = cutlass.max(v, w)
                    else:
                        v = v + w
            cute.arch.barrier()
            if tid < n:
                buf[tid] = v
            cute.arch.barrier()
            step = step * 2

    @cute.jit
    def _batch_of(self, start, c, nseq):
        """The sequence ``b`` of canonical query tile ``c``: the last ``b < nseq`` with
        ``start[b] <= c`` (``start`` ascending, ``start[0] = 0``)."""
        lo = Int32(0)
        span = Int32(MAX_SEQS // 2)
        for _ in cutlass.range_constexpr(10):
            mid = lo + span
            if mid < nseq:
                if start[mid] <= c:
                    lo = mid
            span = span // 2
        return lo

    @cute.kernel
    def kernel(self, mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart,
               Smem: cutlass.Constexpr):
        tid, _, _ = cute.arch.thread_idx()
        tid = Int32(tid)
        st = smem_storage(Smem)
        keys = st.keys.get_tensor(cute.make_layout(MAX_SLOTS))
        cq = st.cq.get_tensor(cute.make_layout(MAX_SEQS))
        ck = st.ck.get_tensor(cute.make_layout(MAX_SEQS))
        start = st.start.get_tensor(cute.make_layout(MAX_SEQS))
        qstart = st.qstart.get_tensor(cute.make_layout(MAX_SEQS))
        t_q = Int32(mParam[0])
        t_k = Int32(mParam[1])
        left = Int32(mParam[2])
        right = Int32(mParam[3])
        n_slots = Int32(mParam[4])
        n_pow2 = Int32(mParam[5])
        nb = Int32(mCuQ.shape[0]) - 1  # B
        bm = self.bm

        # ---- sanitised offsets: cu[0] = 0, clamp to [0, total], running max
        if tid <= nb:
            xq = cutlass.min(cutlass.max(Int32(mCuQ[tid]), Int32(0)), t_q)
            xk = cutlass.min(cutlass.max(Int32(mCuK[tid]), Int32(0)), t_k)
            if tid == 0:
                xq = Int32(0)
                xk = Int32(0)
            cq[tid] = xq
            ck[tid] = xk
        cute.arch.barrier()
        self._scan(cq, tid, nb + 1, True)
        self._scan(ck, tid, nb + 1, True)
        # pseudo-sequence B: forward queries up to T_q without keys, backward keys up to T_k
        # without queries
        if tid == 0:
            if cutlass.const_expr(self.kv_major):
                cq[nb + 1] = cq[nb]
                ck[nb + 1] = t_k
            else:
                cq[nb + 1] = t_q
                ck[nb + 1] = ck[nb]
        cute.arch.barrier()
        if tid <= nb + 1:
            mCuQs[tid] = cq[tid]
            mCuKs[tid] = ck[tid]
        # ---- tiles per sequence (B + 1 of them) -> exclusive prefix sum
        nseq = nb + 1
        cmaj = ck if cutlass.const_expr(self.kv_major) else cq
        if tid < nseq:
            start[tid + 1] = (cmaj[tid + 1] - cmaj[tid] + (bm - 1)) // bm
            if cutlass.const_expr(self.kv_major):
                qstart[tid + 1] = ((cq[tid + 1] - cq[tid] + (self.block_other - 1))
                                   // self.block_other)
        if tid == 0:
            start[0] = Int32(0)
            qstart[0] = Int32(0)
        cute.arch.barrier()
        self._scan(start, tid, nseq + 1, False)
        if cutlass.const_expr(self.kv_major):
            self._scan(qstart, tid, nseq + 1, False)
            if tid <= nseq:
                mQStart[tid] = qstart[tid]
        total = start[nseq]
        # ---- sort keys of the canonical tiles
        for c in cutlass.range(tid, n_pow2, NUM_THREADS, unroll=1):
            key = Int32(_IDLE)
            if c < total:
                key = c
                if cutlass.const_expr(self.sort):
                    b = self._batch_of(start, c, nseq)
                    m0 = (c - start[b]) * bm
                    lq = cq[b + 1] - cq[b]
                    lk = ck[b + 1] - ck[b]
                    off = lk - lq
                    lo = Int32(0)
                    hi = Int32(0)
                    if cutlass.const_expr(self.kv_major):
                        # query rows that see keys [m0, m1) of the sequence
                        m1 = cutlass.min(m0 + bm, lk)
                        hi = lq
                        if right >= 0:
                            lo = cutlass.max(m0 - right - off, Int32(0))
                        if left >= 0:
                            hi = cutlass.min(m1 + left - off, lq)
                    else:
                        # keys that rows [m0, m1) see
                        m1 = cutlass.min(m0 + bm, lq)
                        hi = lk
                        if left >= 0:
                            lo = cutlass.max(m0 + off - left, Int32(0))
                        if right >= 0:
                            hi = cutlass.min(m1 + off + right, lk)
                    work = cutlass.min(cutlass.max(hi - lo, Int32(0)) // 64 + 1,
                                       Int32(_WORK_MAX))
                    key = ((Int32(_WORK_MAX) - work) << _IDX_BITS) | c
            keys[c] = key
        cute.arch.barrier()
        # ---- bitonic sort of keys[0:n_pow2], ascending
        k = Int32(2)
        if cutlass.const_expr(not self.sort):
            k = n_pow2 + 1  # canonical order: no sort
        while k <= n_pow2:
            j = k // 2
            while j > 0:
                for i in cutlass.range(tid, n_pow2, NUM_THREADS, unroll=1):
                    partner = i ^ j
                    if partner > i:
                        a = keys[i]
                        bval = keys[partner]
                        swap = a > bval
                        if (i & k) != 0:
                            swap = a < bval
                        if swap:
                            keys[i] = bval
                            keys[partner] = a
                cute.arch.barrier()
                j = j // 2
            k = k * 2
        # ---- schedule rows
        for s in cutlass.range(tid, n_slots, NUM_THREADS, unroll=1):
            key = keys[s]
            b_out = Int32(-1)
            m_out = Int32(0)
            if key != Int32(_IDLE):
                c = key & Int32((1 << _IDX_BITS) - 1)
                b = self._batch_of(start, c, nseq)
                b_out = b
                m_out = c - start[b]
            mTile[s, 0] = b_out
            mTile[s, 1] = m_out
            if cutlass.const_expr(not self.kv_major):
                mTile[s, 2] = Int32(0)
                mTile[s, 3] = Int32(0)
                mTile[s, 4] = Int32(0)


__all__ = ["HstuSchedule", "MAX_SEQS", "MAX_SLOTS"]
