"""Schedule order of the deterministic block-sparse backward's K->Q lists (CuTe DSL, no jax
imports).

The deterministic backward adds the dQ contributions to each 64-row query tile in a fixed
order: a CTA (one KV block, i.e. one row of the K->Q CSR lists) waits until its entry's rank
among the tile's contributions has come up. This kernel computes an order in which those
waits are short: each chain (the ``n_kv`` consecutive CSR rows of one batch and KV head,
whose entries name the chain's ``n_tiles`` query tiles) is coloured in rounds, a greedy
bipartite edge colouring run in parallel. Round ``t`` stands for the ``t``-th step of the
estimated schedule; a row is active in it when it has uncoloured entries, ``t`` has reached
its estimated start (``mStarts``) and, for the chain's row ``n >= window``, its rows
``<= n - window`` finished in earlier rounds. In up to ``subrounds`` sub-rounds, every active
row that has not coloured an entry in this round proposes its first uncoloured entry (CSR
order) whose tile no row has taken in this round; the lowest proposing row gets the tile
(a shared-memory ``atom.min.u64`` on ``(sub-round, row)`` keys, so the result does not
depend on timing). The entry then becomes the row's next entry (``mEntriesOut``) and takes
the tile's next rank (``mRanksOut``). ``metadata.kq_schedule_order_reference`` is the
same computation in numpy, the definition the kernel's output must equal bit for bit; its
docstring gives the argument that the order cannot deadlock.

One CTA per chain, one thread per row (``rows_per_thread`` rows each when a chain has more
rows than a CTA has threads). Shared memory holds the chain's entries, per tile the round of
its last taking, its rank counter and the proposals, per entry a coloured bit, per row the
round it finished in; per row a register holds the length of its coloured prefix, where
the row's scans start. A proposal scan checks ``SCAN`` entries at once (their loads are
independent). Two CTA barriers per sub-round and one per round; a round in which no row is
active (nothing can change before the earliest start of a pending row) adds one and jumps
to that start, the round the numpy definition would reach next with an active row.

``publish`` (the backward's ``detstream``, ``ffi.bsa._bwd_det_stream_entry``): the backward
runs alongside and reads each CSR row's entries once they are coloured. Each row's thread
keeps its coloured prefix length in shared memory; after a round with active rows every lane
of warp 0 executes ``fence.acq_rel.gpu`` (after the round's last barrier, so it orders every
thread's entries, ranks and prefix lengths before it) and then stores the changed prefix
lengths of its rows to ``mProgress`` with relaxed GPU-scope stores: a release by the storing
lane, which the backward's acquire load of the counter synchronizes with. With ``pdl`` the
kernel waits for the previous grid first and then lets its dependent launch.

``fast`` (the backward's ``bsa_bwd_ws`` option ``ordfast``) computes the same order with fewer
serialized shared-memory operations per sub-round: the "some row proposed" flag is the
reduction of the proposal barrier itself (``bar.red.or.pred``) instead of a flag every
proposer stores; the count of entries left is decremented once per warp (a ballot of its
winners, lane 0's ``atom.add``) instead of once per winner on one address; the proposal keys
are 32 bits, ``(KBIG - sub-round) << row_bits | row``, where the kernel's sub-rounds fit
(``atom.shared.min.s32``; else the 64-bit keys); an active row skips its coloured prefix a
bit word at a time (the trailing ones of the word, by ``brev`` and ``clz``). ``scan`` sets
how many entries a proposal scan checks at once (default :data:`SCAN`). ``held`` > 0: each
row's estimated start (``metadata.kq_schedule_starts`` for ``held`` CTA slots) is computed
from the offsets here instead of read from ``mStarts``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects.llvm import AsmDialect  # noqa: F401  (the inline_asm dialect)
from cutlass.cutlass_dsl import T, dsl_user_op

from .common import elem_ptr, fence_acq_rel_gpu, inline_asm, st_relaxed_s32

#: rounds / sub-rounds keys: (BIG - sub-round) << 32 | row, so a later sub-round's key is
#: smaller than any earlier one and ``atom.min`` needs no reset between sub-rounds
BIG = 0x7FFFFFFF
#: most threads per CTA
MAX_THREADS = 1024
#: entries a proposal scan checks at once
SCAN = 4


@dsl_user_op
def atom_min_shared_u64(sptr, val, *, loc=None, ip=None):
    """``atom.shared.min.u64 [sptr], val`` (the old value is dropped)."""
    inline_asm(T.i64(), [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                         Int64(val).ir_value(loc=loc, ip=ip)],
               "atom.shared.min.u64 $0, [$1], $2;", "=l,r,l", True, loc, ip)


@dsl_user_op
def atom_min_shared_s32(sptr, val, *, loc=None, ip=None):
    """``atom.shared.min.s32 [sptr], val`` (the old value is dropped)."""
    inline_asm(T.i32(), [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                         Int32(val).ir_value(loc=loc, ip=ip)],
               "atom.shared.min.s32 $0, [$1], $2;", "=r,r,r", True, loc, ip)


@dsl_user_op
def barrier_or(pred, *, loc=None, ip=None):
    """``bar.red.or.pred`` on barrier 0 over every thread of the CTA: a CTA barrier (with the
    memory ordering of ``bar.sync``) that returns 1 to every thread when ``pred`` (int32) is
    nonzero in any thread, else 0."""
    return Int32(inline_asm(
        T.i32(), [Int32(pred).ir_value(loc=loc, ip=ip)],
        "{\n.reg .pred p, q;\nsetp.ne.s32 p, $1, 0;\nbar.red.or.pred q, 0, p;\n"
        "selp.s32 $0, 1, 0, q;\n}", "=r,r", True, loc, ip))


@dsl_user_op
def atom_or_shared_b32(sptr, val, *, loc=None, ip=None):
    """``atom.shared.or.b32 [sptr], val`` (the old value is dropped)."""
    inline_asm(T.i32(), [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                         Int32(val).ir_value(loc=loc, ip=ip)],
               "atom.shared.or.b32 $0, [$1], $2;", "=r,r,r", True, loc, ip)


@dsl_user_op
def atom_add_shared_s32(sptr, val, *, loc=None, ip=None):
    """``atom.shared.add.s32 [sptr], val`` (the old value is dropped)."""
    inline_asm(T.i32(), [sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
                         Int32(val).ir_value(loc=loc, ip=ip)],
               "atom.shared.add.s32 $0, [$1], $2;", "=r,r,r", True, loc, ip)


def smem_bytes(n_kv: int, n_tiles: int, e_cap: int) -> int:
    """Shared memory of one CTA (before alignment padding), the ``publish`` mode's two
    per-row arrays included."""
    return (4 * n_tiles * 2 + 8 * n_tiles + 4 * e_cap + 4 * (-(-e_cap // 32)) + 4 * n_kv + 32
            + 8 * n_kv)


class BsaDetScheduleOrder:
    """``(offsets, entries, starts) -> (entries_out, ranks_out)`` for chains of ``n_kv``
    CSR rows over ``n_tiles`` query tiles with at most ``e_cap`` entries each (see the
    module docstring). ``offsets`` int32 ``(R + 1,)``, ``entries`` / ``entries_out`` /
    ``ranks_out`` int32 of equal length (slots past ``offsets[R]`` are not written),
    ``starts`` int32 ``(R,)``, ``R`` a multiple of ``n_kv``."""

    def __init__(self, n_kv: int, n_tiles: int, e_cap: int, window: int, subrounds: int = 4,
                 publish: bool = False, pdl: bool = False, scan: int = SCAN,
                 fast: bool = False, held: int = 0):
        if min(n_kv, n_tiles, e_cap, window, subrounds, scan) < 1:
            raise ValueError(f"bsa_det_order: n_kv={n_kv}, n_tiles={n_tiles}, e_cap={e_cap}, "
                             f"window={window}, subrounds={subrounds}, scan={scan} must be "
                             f">= 1")
        self.scan, self.fast = scan, fast
        # held > 0: each row's estimated start is computed here from the offsets (for
        # held CTA slots; mStarts is not read), else read from mStarts
        self.held = max(int(held), 0)
        # fast: 32-bit proposal keys where every sub-round's key stays positive and ordered.
        # Each round with an active row colours an entry (at sub-round 0 no tile is taken
        # yet), and each round without one is followed by a jump to a later pending start,
        # so a chain runs at most subrounds * e_cap + n_kv + 1 sub-rounds.
        self.row_bits = max(1, (n_kv - 1).bit_length())
        self.kbig = (1 << (31 - self.row_bits)) - 1 if self.row_bits < 31 else 0
        self.key32 = fast and subrounds * e_cap + n_kv + 2 < self.kbig
        # fast: the proposal's tile kept in a register for the take phase (up to 4 rows
        # per thread: beyond, the registers of a 1024-thread CTA spill)
        self.keep_tile = fast and -(-n_kv // min(MAX_THREADS, -(-n_kv // 32) * 32)) <= 4
        self.n_kv, self.n_tiles, self.e_cap = n_kv, n_tiles, e_cap
        self.window, self.subrounds = window, subrounds
        self.num_threads = min(MAX_THREADS, -(-n_kv // 32) * 32)
        self.rpt = -(-n_kv // self.num_threads)
        self.n_words = -(-e_cap // 32)
        # publish: after each round with active rows, warp 0 publishes each changed row's
        # coloured prefix length to ``mProgress`` (its lanes fence, then store), for a
        # backward that runs alongside; pdl: it waits for the previous grid and then lets
        # its own dependent (that backward) launch
        self.publish = publish
        self.pdl = pdl and publish

    @cute.jit
    def _start(self, mOffsets, row, n_rows):
        """``metadata.kq_schedule_starts`` of CSR row ``row`` before the chain's start is
        subtracted: ``max(P - (held - 1) L2 / 4, 0) / held`` (``P`` the entries before the
        row, ``L2`` twice the mean row length, rounded down; every term is non-negative, so
        the truncating divisions round down as the definition's do), 0 for the first
        ``held`` rows."""
        o0 = Int32(mOffsets[0])
        mean2 = (2 * (Int32(mOffsets[n_rows]) - o0)) // n_rows
        st = cutlass.max(Int32(mOffsets[row]) - o0 - ((self.held - 1) * mean2) // 4,
                         0) // self.held
        if row < self.held:
            st = Int32(0)
        return st

    @cute.jit
    def __call__(self, mOffsets, mEntries, mStarts, mEntriesOut, mRanksOut, stream,
                 mProgress=None):
        @cute.struct
        class Smem:
            tile_round: cute.struct.Align[cute.struct.MemRange[Int32, self.n_tiles], 16]
            tile_cnt: cute.struct.Align[cute.struct.MemRange[Int32, self.n_tiles], 16]
            tile_prop: cute.struct.Align[cute.struct.MemRange[
                Int32 if self.key32 else Int64, self.n_tiles], 16]
            edge: cute.struct.Align[cute.struct.MemRange[Int32, self.e_cap], 16]
            bits: cute.struct.Align[cute.struct.MemRange[Int32, self.n_words], 16]
            row_fin: cute.struct.Align[cute.struct.MemRange[Int32, self.n_kv], 16]
            misc: cute.struct.Align[cute.struct.MemRange[Int32, 8], 16]
            # publish: per row the coloured prefix length (written by the row's thread) and
            # the last published one (warp 0's)
            row_k: cute.struct.Align[cute.struct.MemRange[
                Int32, self.n_kv if self.publish else 1], 16]
            row_pub: cute.struct.Align[cute.struct.MemRange[
                Int32, self.n_kv if self.publish else 1], 16]

        n_chains = (cute.size(mOffsets.shape[0]) - 1) // self.n_kv
        self.kernel(mOffsets, mEntries, mStarts, mEntriesOut, mRanksOut, mProgress,
                    Smem).launch(
            grid=(n_chains, 1, 1), block=[self.num_threads, 1, 1], smem=Smem.size_in_bytes(),
            stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mOffsets, mEntries, mStarts, mEntriesOut, mRanksOut, mProgress,
               Smem: cutlass.Constexpr):
        tid, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.pdl):
            # every earlier grid has completed before this one reads anything, and only
            # then may the dependent backward launch (it skips its own wait at the start)
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        chain, _, _ = cute.arch.block_idx()
        nt, n_kv, n_tiles, rpt = self.num_threads, self.n_kv, self.n_tiles, self.rpt
        st = cutlass.memory.SmemAllocator().allocate(Smem)
        sRound = st.tile_round.get_tensor(cute.make_layout(n_tiles))
        sCnt = st.tile_cnt.get_tensor(cute.make_layout(n_tiles))
        sProp = st.tile_prop.get_tensor(cute.make_layout(n_tiles))
        sEdge = st.edge.get_tensor(cute.make_layout(self.e_cap))
        sBits = st.bits.get_tensor(cute.make_layout(self.n_words))
        sFin = st.row_fin.get_tensor(cute.make_layout(n_kv))
        sMisc = st.misc.get_tensor(cute.make_layout(8))
        sRowK = st.row_k.get_tensor(cute.make_layout(self.n_kv if self.publish else 1))
        sRowPub = st.row_pub.get_tensor(cute.make_layout(self.n_kv if self.publish else 1))

        row0 = chain * n_kv
        n_rows = cute.size(mOffsets.shape[0]) - 1
        start0 = Int32(0)
        if cutlass.const_expr(self.held > 0):
            # the chain's earliest start is its first row's (starts grow with the row)
            start0 = self._start(mOffsets, row0, n_rows)
        e0 = Int32(mOffsets[row0])
        n_e = cutlass.min(Int32(mOffsets[row0 + n_kv]) - e0, self.e_cap)
        # per-thread rows: chain row tid + i * nt
        rOff = cute.make_rmem_tensor((rpt,), Int32)   # first entry, chain-local
        rDeg = cute.make_rmem_tensor((rpt,), Int32)
        rT0 = cute.make_rmem_tensor((rpt,), Int32)
        rK = cute.make_rmem_tensor((rpt,), Int32)     # entries coloured so far
        rAct = cute.make_rmem_tensor((rpt,), Int32)   # active in this round, no entry yet
        rPtr = cute.make_rmem_tensor((rpt,), Int32)   # scan position in this round
        rFirst = cute.make_rmem_tensor((rpt,), Int32)  # entries before it are all coloured
        rCand = cute.make_rmem_tensor((rpt,), Int32)  # proposed entry (-1: none)
        rTile = cute.make_rmem_tensor((rpt,), Int32)  # fast: its tile
        for i in cutlass.range_constexpr(rpt):
            n = tid + i * nt
            rOff[i] = Int32(0)
            rDeg[i] = Int32(0)
            rT0[i] = Int32(0)
            if n < n_kv:
                a = Int32(mOffsets[row0 + n]) - e0
                b = Int32(mOffsets[row0 + n + 1]) - e0
                # clamped like n_e: a chain never has more than e_cap entries
                a = cutlass.max(cutlass.min(a, n_e), 0)
                b = cutlass.max(cutlass.min(b, n_e), a)
                rOff[i] = a
                rDeg[i] = b - a
                if cutlass.const_expr(self.held > 0):
                    rT0[i] = self._start(mOffsets, row0 + n, n_rows) - start0
                else:
                    rT0[i] = Int32(mStarts[row0 + n])
                fin0 = Int32(BIG)
                if b == a:
                    fin0 = Int32(-1)
                sFin[n] = fin0
                if cutlass.const_expr(self.publish):
                    sRowK[n] = Int32(0)
                    sRowPub[n] = Int32(0)
            rK[i] = Int32(0)
            rFirst[i] = Int32(0)
        for j in cutlass.range(tid, n_tiles, nt, unroll=1):
            sRound[j] = Int32(-1)
            sCnt[j] = Int32(0)
            if cutlass.const_expr(self.key32):
                sProp[j] = Int32(0x7FFFFFFF)  # no proposal
            else:
                sProp[j] = Int64(0x7FFFFFFFFFFFFFFF)
        for j in cutlass.range(tid, self.n_words, nt, unroll=1):
            sBits[j] = Int32(0)
        for j in cutlass.range(tid, n_e, nt, unroll=1):
            # tiles outside [0, n_tiles) would index past the tile arrays: clamped (the CSR
            # builder never produces them)
            sEdge[j] = cutlass.max(cutlass.min(Int32(mEntries[e0 + j]), n_tiles - 1), 0)
        if tid == 0:
            sMisc[0] = n_e       # entries left to colour
            sMisc[1] = Int32(0)  # rows 0 .. fin-1 finished in earlier rounds
            sMisc[2] = Int32(0)  # "some row proposed" flags, by sub-round parity
            sMisc[3] = Int32(0)
            sMisc[4] = Int32(BIG)  # the earliest start of a pending row (idle rounds)
        cute.arch.barrier()

        t = Int32(0)
        sc = Int32(0)
        left = Int32(sMisc[0])
        while left > 0:
            if tid == 0:
                f = Int32(sMisc[1])
                go = Int32(1)
                while go != 0:
                    go = Int32(0)
                    if f < n_kv:
                        if Int32(sFin[cutlass.min(f, n_kv - 1)]) < t:
                            f += 1
                            go = Int32(1)
                sMisc[1] = f
            cute.arch.barrier()
            fin = Int32(sMisc[1])
            if tid == 0:
                # every thread read the last idle round's minimum before this barrier
                sMisc[4] = Int32(BIG)
            for i in cutlass.range_constexpr(rpt):
                n = tid + i * nt
                act = Int32(0)
                if n < n_kv:
                    if rK[i] < rDeg[i]:
                        if t >= rT0[i]:
                            act = Int32(1)
                            if cutlass.const_expr(self.window < n_kv):
                                if n >= self.window:
                                    if fin < n - self.window + 1:
                                        act = Int32(0)
                rAct[i] = act
                # an active row's scan starts past its coloured prefix (the bits are only
                # read until the first sub-round's barrier)
                p = rFirst[i]
                if act != 0:
                    go = Int32(0)
                    if p < rDeg[i]:
                        go = Int32(1)
                    while go != 0:
                        e = rOff[i] + p
                        go = Int32(0)
                        if cutlass.const_expr(self.fast):
                            # the word's coloured bits from entry e on: its trailing ones
                            # (the arithmetic shift may add ones past the word: clamped)
                            sh = e & 31
                            w = Int32(sBits[e >> 5]) >> sh
                            ones = cutlass.min(
                                Int32(cute.arch.clz(cute.arch.brev(Int32(~w)))), 32 - sh)
                            p = cutlass.min(p + ones, rDeg[i])
                            if ones == 32 - sh:
                                if p < rDeg[i]:
                                    go = Int32(1)
                        else:
                            if ((Int32(sBits[e >> 5]) >> (e & 31)) & 1) != 0:
                                p += 1
                                if p < rDeg[i]:
                                    go = Int32(1)
                    rFirst[i] = p
                rPtr[i] = p
            s = Int32(0)
            go_s = Int32(1)
            any0 = Int32(1)  # some row proposed in the first sub-round (some row was active)
            while go_s != 0:
                if cutlass.const_expr(self.key32):
                    key = Int32(self.kbig - sc) << self.row_bits
                else:
                    key = Int64(BIG - sc) << 32
                proposed = Int32(0)
                # proposals: each active row's first uncoloured entry whose tile is free
                for i in cutlass.range_constexpr(rpt):
                    rCand[i] = Int32(-1)
                    if rAct[i] != 0:
                        p = rPtr[i]
                        deg = rDeg[i]
                        base = rOff[i]
                        go = Int32(0)
                        if p < deg:
                            go = Int32(1)
                        while go != 0:
                            # SCAN entries p .. p + SCAN - 1 at once: their loads are
                            # independent (an entry past the row's end reads the row's last
                            # one and counts as taken), then the first free one
                            bit, rnd = [], []
                            for j in cutlass.range_constexpr(self.scan):
                                e = base + cutlass.min(p + j, deg - 1)
                                bit.append((Int32(sBits[e >> 5]) >> (e & 31)) & 1)
                                rnd.append(Int32(sRound[Int32(sEdge[e])]))
                            first = Int32(self.scan)
                            for j in cutlass.range_constexpr(self.scan - 1, -1, -1):
                                if bit[j] == 0:
                                    if rnd[j] != t:
                                        if p + j < deg:
                                            first = Int32(j)
                            go = Int32(0)
                            if first < self.scan:
                                p += first
                            else:
                                p += self.scan
                                if p < deg:
                                    go = Int32(1)
                                else:
                                    p = deg
                        rPtr[i] = p
                        if p < deg:
                            rCand[i] = p
                            tile = Int32(sEdge[base + p])
                            if cutlass.const_expr(self.keep_tile):
                                rTile[i] = tile
                            if cutlass.const_expr(self.key32):
                                atom_min_shared_s32(st.tile_prop.data_ptr() + tile,
                                                    key | Int32(tid + i * nt))
                            else:
                                atom_min_shared_u64(st.tile_prop.data_ptr() + tile,
                                                    key | Int64(tid + i * nt))
                            if cutlass.const_expr(self.fast):
                                proposed = Int32(1)
                            else:
                                sMisc[2 + (sc & 1)] = Int32(1)
                if cutlass.const_expr(self.fast):
                    more = barrier_or(proposed)
                else:
                    cute.arch.barrier()
                    more = Int32(sMisc[2 + (sc & 1)])
                if s == 0:
                    any0 = more
                # the lowest proposer of each tile takes it
                won = Int32(0)  # fast: entries this warp coloured
                for i in cutlass.range_constexpr(rpt):
                    took = Int32(0)
                    if rCand[i] >= 0:
                        n = tid + i * nt
                        e = rOff[i] + rCand[i]
                        tile = Int32(0)
                        if cutlass.const_expr(self.keep_tile):
                            tile = rTile[i]
                        else:
                            tile = Int32(sEdge[e])
                        mine = False
                        if cutlass.const_expr(self.key32):
                            mine = Int32(sProp[tile]) == (key | Int32(n))
                        else:
                            mine = Int64(sProp[tile]) == (key | Int64(n))
                        if mine:
                            rank = Int32(sCnt[tile])
                            sCnt[tile] = rank + 1
                            sRound[tile] = t
                            out = e0 + rOff[i] + rK[i]
                            mEntriesOut[out] = tile
                            mRanksOut[out] = rank
                            rK[i] = rK[i] + 1
                            if cutlass.const_expr(self.publish):
                                sRowK[n] = rK[i]
                            atom_or_shared_b32(st.bits.data_ptr() + (e >> 5),
                                               Int32(1) << (e & 31))
                            if cutlass.const_expr(self.fast):
                                took = Int32(1)
                            else:
                                atom_add_shared_s32(st.misc.data_ptr(), Int32(-1))
                            rAct[i] = Int32(0)
                            if rK[i] == rDeg[i]:
                                sFin[n] = t
                        else:
                            rPtr[i] = rCand[i] + 1
                    if cutlass.const_expr(self.fast):
                        # every lane of the warp, converged after the row's branch
                        won += cute.arch.popc(cute.arch.vote_ballot_sync(took != 0))
                if cutlass.const_expr(self.fast):
                    if tid % 32 == 0:
                        if won != 0:
                            atom_add_shared_s32(st.misc.data_ptr(), -won)
                else:
                    if tid == 0:
                        # the flag of the next sub-round (read last one sub-round ago)
                        sMisc[2 + ((sc + 1) & 1)] = Int32(0)
                cute.arch.barrier()
                s += 1
                sc += 1
                go_s = Int32(0)
                if s < self.subrounds:
                    if more != 0:
                        go_s = Int32(1)
            t += 1
            if cutlass.const_expr(self.publish):
                if any0 != 0:
                    if tid < 32:
                        # the round's entries, ranks and prefix lengths (every thread's, before
                        # the last sub-round's barrier) precede each lane's fence, and the
                        # fence precedes the lane's stores: a release by each storing lane
                        fence_acq_rel_gpu()
                        for n in cutlass.range(tid, n_kv, 32, unroll=1):
                            k = Int32(sRowK[n])
                            if k != Int32(sRowPub[n]):
                                sRowPub[n] = k
                                st_relaxed_s32(elem_ptr(mProgress, (row0 + n,)), k)
            if any0 == 0:
                # no row was active, so none finished and none can start before the earliest
                # start of a pending row: the rounds up to it are skipped (they would change
                # nothing; rows whose start has passed wait for the window)
                for i in cutlass.range_constexpr(rpt):
                    if rK[i] < rDeg[i]:
                        if rT0[i] >= t:
                            atom_min_shared_s32(st.misc.data_ptr() + 4, rT0[i])
                cute.arch.barrier()
                t_next = Int32(sMisc[4])
                if t_next != BIG:
                    t = cutlass.max(t, t_next)
            left = Int32(sMisc[0])
