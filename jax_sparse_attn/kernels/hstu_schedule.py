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
* paged-KV forward (``HstuSchedule(block_m, paged=True)``): also the sanitised page table
  offsets ``page_indptrs`` (clamped to ``[0, P]``, non-decreasing, plus an empty
  pseudo-sequence; one more scan of the same kind); ``T_k`` is then the keys the page table
  can hold (``P * page size``).
* backward (``HstuSchedule(block_n, kv_major=True, block_other=block_m)``): the KV tiles
  ``[batch, n_block]`` of ``block_n`` keys, longest work first (``sort``; the number of
  query rows the window lets see the tile, as ``metadata.hstu_bwd_schedule``) or in
  canonical order, and ``q_start`` (B + 2,): each sequence's first canonical query tile of
  ``block_m`` rows.

Sort keys are 32-bit ``(2^17 - 2 - work) << 14 | canonical index`` (idle slots
``(2^17 - 1) << 14 | index``), all distinct. Chunked order (``chunk=True``, a seventh
parameter ``tokens``): the 17 high bits are ``chunk << 10 | (1022 - work)`` with ``chunk =
min(cu_k[b] // tokens, 126)`` of the tile's sequence ``b`` (backward: ``cu_q[b] // tokens``)
and ``work`` saturating at 1022, so the tiles of the sequences whose keys (backward:
queries) start in one ``tokens``-row chunk are consecutive, longest work first within the
chunk: up to ``RANK_SLOTS`` tiles each thread counts the
keys below its own (its row's position, no barrier), beyond that a bitonic sort in shared
memory. The scans (running max of the offsets, tile counts) are warp-shuffle scans with one
shared-memory step across warps.

Backward with ``zero_ctas`` > 0: the launch has ``1 + zero_ctas`` CTAs; CTA 0 builds the
schedule, the others write zeros to the fp32 dQ workspace ``mZero`` (a flat tensor of a
multiple of 4 floats, 16-byte aligned) in a grid-stride loop of 16-byte stores, so that no
separate memset runs between this launch and the backward (which may then launch early,
programmatically dependent on this one).

The XLA formulation of the same schedule costs about ten small kernels (a sort, scans,
gathers, concatenations); this is one. Limits (static, checked by the caller): at most
``MAX_SEQS`` sequences incl. the pseudo-sequence and ``MAX_SLOTS`` schedule rows; a
``func`` mask needs the per-tile interval summary and keeps the XLA path.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import elem_ptr, launch, smem_storage

NUM_THREADS = 1024
MAX_SEQS = 1024  # sequences incl. the pseudo-sequence (one scan element per thread)
MAX_SLOTS = 8192  # schedule rows (sort keys in shared memory)
RANK_SLOTS = 2048  # up to here: rank counting; beyond: bitonic sort
_IDX_BITS = 14  # canonical index bits of a sort key (MAX_SLOTS <= 2^14)
_WORK_MAX = (1 << 17) - 2  # work (64-key units) saturates here
_IDLE_HI = (1 << 17) - 1  # the high part of an idle slot's key: sorts last
_IDX_MASK = (1 << _IDX_BITS) - 1
_CHUNK_WORK_BITS = 10  # chunked order: work bits below the chunk index
_CHUNK_WORK_MAX = (1 << _CHUNK_WORK_BITS) - 2
_CHUNK_MAX = (1 << (17 - _CHUNK_WORK_BITS)) - 2  # chunk indices saturate here (below idle)


class HstuSchedule:
    def __init__(self, block: int, kv_major: bool = False, block_other: int = 0,
                 sort: bool = True, paged: bool = False, pdl: bool = False,
                 chunk: bool = False, zero_ctas: int = 0):
        self.bm = block
        # CTAs besides the schedule's that zero the backward's dQ workspace (mZero)
        self.zero_ctas = zero_ctas if kv_major else 0
        self.chunk = chunk and not paged and sort
        self.pdl = pdl
        self.kv_major = kv_major
        self.block_other = block_other
        self.sort = sort
        self.paged = paged

    @cute.jit
    def __call__(self, mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, stream,
                 mPtr=None, mPtrS=None, mCounter=None, mZero=None):
        """``mCuQ``/``mCuK`` (B + 1,) raw offsets; ``mParam`` int32 ``[T_q, T_k, left, right,
        n_slots, n_pow2]`` (``n_pow2``: a power of two >= ``n_slots``; paged: a seventh entry,
        the page slots ``P``; chunked order: a seventh entry, the keys per chunk); outputs ``mCuQs``, ``mCuKs`` (B + 2,), ``mTile`` (n_slots, 5)
        forward / (n_slots, 2) backward and (backward) ``mQStart`` (B + 2,). Paged: ``mPtr``
        (B + 1,) raw ``page_indptrs`` -> ``mPtrS`` (B + 2,). ``mCounter`` (optional, int32
        (1,)): set to 0 (the work-item counter of the forward's dynamic deal). ``mZero``
        (backward with ``zero_ctas``: fp32 ``(n,)``, ``n`` a multiple of 4, 16-byte
        aligned): set to 0 by CTAs ``1 .. zero_ctas``."""

        @cute.struct
        class Smem:
            keys: cute.struct.MemRange[Int32, MAX_SLOTS]
            cq: cute.struct.MemRange[Int32, MAX_SEQS]
            ck: cute.struct.MemRange[Int32, MAX_SEQS]
            start: cute.struct.MemRange[Int32, MAX_SEQS]
            wtot: cute.struct.MemRange[Int32, 64]

        if cutlass.const_expr(self.paged):
            launch(self.kernel(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem, mPtr,
                               mPtrS), (1, 1, 1), NUM_THREADS, Smem, stream, use_pdl=self.pdl)
        elif cutlass.const_expr(self.zero_ctas > 0 and mZero is not None):
            launch(self.kernel(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem,
                               mZero=mZero),
                   (1 + self.zero_ctas, 1, 1), NUM_THREADS, Smem, stream, use_pdl=self.pdl)
        else:
            launch(self.kernel(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem,
                               mCounter=mCounter),
                   (1, 1, 1), NUM_THREADS, Smem, stream, use_pdl=self.pdl)

    @cute.jit
    def _warp_scan(self, v, lane, is_max: cutlass.Constexpr):
        """Inclusive scan (max or sum) of ``v`` over the lanes of a warp."""
        for i in cutlass.range_constexpr(5):
            y = cute.arch.shuffle_sync_up(v, 1 << i)
            if lane >= (1 << i):
                if cutlass.const_expr(is_max):
                    v = cutlass.max(v, y)
                else:
                    v = v + y
        return v

    @cute.jit
    def _scan2(self, a, b, tid, wtot, is_max: cutlass.Constexpr):
        """Inclusive scans (max or sum) of two values per thread over the CTA's threads in
        thread order: warp shuffles, then the warp totals (``wtot``: two 32-entry slots)
        scanned by warp 0. Two CTA barriers."""
        lane = tid % 32
        warp = tid // 32
        a = self._warp_scan(a, lane, is_max)
        b = self._warp_scan(b, lane, is_max)
        if lane == 31:
            wtot[warp] = a
            wtot[32 + warp] = b
        cute.arch.barrier()
        if warp == 0:
            wtot[lane] = self._warp_scan(wtot[lane], lane, is_max)
            wtot[32 + lane] = self._warp_scan(wtot[32 + lane], lane, is_max)
        cute.arch.barrier()
        if warp > 0:
            if cutlass.const_expr(is_max):
                a = cutlass.max(a, wtot[warp - 1])
                b = cutlass.max(b, wtot[32 + warp - 1])
            else:
                a = a + wtot[warp - 1]
                b = b + wtot[32 + warp - 1]
        return a, b

    @cute.jit
    def _batch_of(self, start, c, nseq):
        """The sequence ``b`` of canonical tile ``c``: the last ``b < nseq`` with
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

    @cute.jit
    def _key(self, c, total, start, cq, ck, nseq, left, right, tokens):
        """The sort key of canonical tile ``c`` (see the module docstring)."""
        bm = self.bm
        key = (Int32(_IDLE_HI) << _IDX_BITS) | c
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
                if cutlass.const_expr(self.chunk):
                    work = cutlass.min(cutlass.max(hi - lo, Int32(0)) // 64 + 1,
                                       Int32(_CHUNK_WORK_MAX))
                    # the sequence's first query (backward: Q, dO and dQ are what the CTAs
                    # of a KV tile stream) or first key (forward: K and V)
                    first = cq[b] if cutlass.const_expr(self.kv_major) else ck[b]
                    chunk = cutlass.min(first // tokens, Int32(_CHUNK_MAX))
                    hi17 = (chunk << _CHUNK_WORK_BITS) | (Int32(_CHUNK_WORK_MAX) - work)
                    key = (hi17 << _IDX_BITS) | c
                else:
                    work = cutlass.min(cutlass.max(hi - lo, Int32(0)) // 64 + 1,
                                       Int32(_WORK_MAX))
                    key = ((Int32(_WORK_MAX) - work) << _IDX_BITS) | c
        return key

    @cute.jit
    def _write_row(self, mTile, s, key, start, nseq):
        """Schedule row ``s`` of the tile with sort key ``key``."""
        b_out = Int32(-1)
        m_out = Int32(0)
        if (key >> _IDX_BITS) != Int32(_IDLE_HI):
            c = key & Int32(_IDX_MASK)
            b = self._batch_of(start, c, nseq)
            b_out = b
            m_out = c - start[b]
        mTile[s, 0] = b_out
        mTile[s, 1] = m_out
        if cutlass.const_expr(not self.kv_major):
            mTile[s, 2] = Int32(0)
            mTile[s, 3] = Int32(0)
            mTile[s, 4] = Int32(0)

    @cute.kernel
    def kernel(self, mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart,
               Smem: cutlass.Constexpr, mPtr=None, mPtrS=None, mCounter=None, mZero=None):
        tid, _, _ = cute.arch.thread_idx()
        tid = Int32(tid)
        if cutlass.const_expr(self.pdl):
            # programmatic dependent launch: the attention kernel may launch now (it waits
            # for this grid before it reads the schedule); this grid waits for its own
            # predecessor before it touches global memory
            cute.arch.griddepcontrol_launch_dependents()
            cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(mZero is not None):
            bid, _, _ = cute.arch.block_idx()
            if bid > 0:
                self._zero(mZero, Int32(bid) - 1, tid)
            else:
                self._schedule(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem, tid,
                               mPtr, mPtrS, mCounter)
        else:
            self._schedule(mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart, Smem, tid,
                           mPtr, mPtrS, mCounter)

    @cute.jit
    def _zero(self, mZero, cta, tid):
        """CTA ``cta`` of the ``zero_ctas`` zeroing CTAs: 16-byte stores of zeros over the
        flat fp32 ``mZero``, grid-stride."""
        zero = cute.make_rmem_tensor(4, Float32)
        zero.fill(0.0)
        n_vec = Int32(mZero.shape[0]) // 4
        for i in cutlass.range(cta * NUM_THREADS + tid, n_vec, self.zero_ctas * NUM_THREADS,
                               unroll=4):
            g = cute.make_ptr(Float32, elem_ptr(mZero, (i * 4,)).toint(),
                              cute.AddressSpace.gmem, assumed_align=16)
            cute.make_tensor(g, cute.make_layout(4)).store(zero.load())

    @cute.jit
    def _schedule(self, mCuQ, mCuK, mParam, mCuQs, mCuKs, mTile, mQStart,
                  Smem: cutlass.Constexpr, tid, mPtr, mPtrS, mCounter):
        """The schedule (CTA 0)."""
        if cutlass.const_expr(mCounter is not None):
            if tid == 0:
                mCounter[0] = Int32(0)
        st = smem_storage(Smem)
        keys = st.keys.get_tensor(cute.make_layout(MAX_SLOTS))
        cq = st.cq.get_tensor(cute.make_layout(MAX_SEQS))
        ck = st.ck.get_tensor(cute.make_layout(MAX_SEQS))
        start = st.start.get_tensor(cute.make_layout(MAX_SEQS))
        wtot = st.wtot.get_tensor(cute.make_layout(64))
        t_q = Int32(mParam[0])
        t_k = Int32(mParam[1])
        left = Int32(mParam[2])
        right = Int32(mParam[3])
        n_slots = Int32(mParam[4])
        n_pow2 = Int32(mParam[5])
        tokens = Int32(1)
        if cutlass.const_expr(self.chunk):
            tokens = cutlass.max(Int32(mParam[6]), Int32(1))
        nb = Int32(mCuQ.shape[0]) - 1  # B
        nseq = nb + 1  # with the pseudo-sequence
        bm = self.bm

        # ---- sanitised offsets: cu[0] = 0, clamp to [0, total], running max
        xq = Int32(0)
        xk = Int32(0)
        if tid <= nb:
            if tid > 0:
                xq = cutlass.min(cutlass.max(Int32(mCuQ[tid]), Int32(0)), t_q)
                xk = cutlass.min(cutlass.max(Int32(mCuK[tid]), Int32(0)), t_k)
        xq, xk = self._scan2(xq, xk, tid, wtot, True)
        if tid <= nb:
            cq[tid] = xq
            ck[tid] = xk
            mCuQs[tid] = xq
            mCuKs[tid] = xk
        if tid == nb:
            # pseudo-sequence B: forward queries up to T_q without keys, backward keys up to
            # T_k without queries
            pq = t_q
            pk = xk
            if cutlass.const_expr(self.kv_major):
                pq = xq
                pk = t_k
            cq[nb + 1] = pq
            ck[nb + 1] = pk
            mCuQs[nb + 1] = pq
            mCuKs[nb + 1] = pk
        if cutlass.const_expr(self.paged):
            # page table offsets: the same sanitising scan, clamped to the P page slots
            n_ptr = Int32(mParam[6])
            cute.arch.barrier()  # every read of wtot by the scan above is done
            xp = Int32(0)
            if tid <= nb:
                if tid > 0:
                    xp = cutlass.min(cutlass.max(Int32(mPtr[tid]), Int32(0)), n_ptr)
            xp, _ = self._scan2(xp, Int32(0), tid, wtot, True)
            if tid <= nb:
                mPtrS[tid] = xp
            if tid == nb:
                mPtrS[nb + 1] = xp  # the pseudo-sequence owns no page
        cute.arch.barrier()
        # ---- tiles per sequence -> exclusive prefix sums (start; backward: q_start too)
        nt = Int32(0)
        ntq = Int32(0)
        if tid < nseq:
            if cutlass.const_expr(self.kv_major):
                nt = (ck[tid + 1] - ck[tid] + (bm - 1)) // bm
                ntq = (cq[tid + 1] - cq[tid] + (self.block_other - 1)) // self.block_other
            else:
                nt = (cq[tid + 1] - cq[tid] + (bm - 1)) // bm
        nt, ntq = self._scan2(nt, ntq, tid, wtot, False)
        if tid < nseq:
            start[tid + 1] = nt
            if cutlass.const_expr(self.kv_major):
                mQStart[tid + 1] = ntq
        if tid == 0:
            start[0] = Int32(0)
            if cutlass.const_expr(self.kv_major):
                mQStart[0] = Int32(0)
        cute.arch.barrier()
        total = start[nseq]
        # ---- sort keys of the canonical tiles
        for c in cutlass.range(tid, n_pow2, NUM_THREADS, unroll=1):
            keys[c] = self._key(c, total, start, cq, ck, nseq, left, right, tokens)
        cute.arch.barrier()
        if cutlass.const_expr(not self.sort):
            for s in cutlass.range(tid, n_slots, NUM_THREADS, unroll=1):
                self._write_row(mTile, s, keys[s], start, nseq)
        else:
            if n_slots <= RANK_SLOTS:
                # each key's rank among all keys is its row
                for c in cutlass.range(tid, n_slots, NUM_THREADS, unroll=1):
                    key = keys[c]
                    r = Int32(0)
                    for c2 in cutlass.range(n_slots, unroll=4):
                        if keys[c2] < key:
                            r = r + 1
                    self._write_row(mTile, r, key, start, nseq)
            else:
                # bitonic sort of keys[0:n_pow2], ascending
                k = Int32(2)
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
                for s in cutlass.range(tid, n_slots, NUM_THREADS, unroll=1):
                    self._write_row(mTile, s, keys[s], start, nseq)


__all__ = ["HstuSchedule", "MAX_SEQS", "MAX_SLOTS"]
