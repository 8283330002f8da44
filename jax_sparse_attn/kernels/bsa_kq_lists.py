"""K->Q block lists of the block-sparse backward in one launch (CuTe DSL, no jax imports).

The backward's CTAs each own one KV block and walk the query blocks that list it: the
K->Q lists in CSR form, ``offsets`` (``R + 1`` int32, ``R = B H_kv N_kv`` rows, row
``r = (b H_kv + g) N_kv + n``) and ``entries`` (``B H_q N_q K_max`` slots, row ``r``'s
entries ``entries[offsets[r]:offsets[r + 1]]``, each ``h_in_group N_q + m``, increasing).
This kernel computes ``metadata.build_kq_csr`` of the metadata as
``metadata.sanitize_bsa_metadata`` clamps them (ids clipped to ``[0, N_kv)``, counts to
``[0, K_max]``; the slots past a row's count are skipped; an id repeated in a row's active
prefix is listed once, as by ``build_kq_csr``'s bitmap construction), with the slots past
``offsets[R]`` zero as there.

One thread-block cluster of ``CLUSTER`` CTAs, so that the whole grid can synchronize
without a zeroed flag in global memory:

1. Chains (one per batch and KV head: ``G N_q`` query rows, ``G`` the group size) go to the
   CTAs round-robin. A CTA clears a shared-memory bitmap of the chain (word ``w`` of KV
   block ``n`` at ``w N_kv + n``, bit ``col % 32`` of word ``col / 32`` for the query row
   ``col = h_in_group N_q + m``) and sets one bit per active slot with ``atom.shared.or``
   (each thread loads ``SLOTS`` slots at once, then sets their bits); then one thread per
   KV block takes the popcount of its words (the row's length) and stores the words and the
   length to the scratch outputs ``words`` / ``counts``.
2. ``fence.acq_rel.gpu`` and the cluster barrier (arrive with release, wait with acquire
   semantics): every CTA then sees every chain's words and lengths.
3. Each CTA scans all ``R`` lengths (a block-wide exclusive scan in shared memory) and CTA
   ``k`` stores the offsets of rows ``k T + t, k T + t + CLUSTER T, ...``. One warp per row
   (over the cluster's warps, ``ROWS`` rows at a time) writes the row's entries: each lane
   takes one word of a 32-word chunk, and its bits go to the row's start plus the set bits
   of the row's words before it (a warp scan of the popcounts), so the lanes of one store
   write neighbouring places of one row. The slots from ``offsets[R]`` to the end are
   zeroed by the cluster's threads in a strided loop.

4. With ``bucket_entries`` (the work items of a backward that splits long K->Q lists across
   CTAs in buckets, ``metadata.kq_bucket_items``, bit for bit): each CTA takes chains
   round-robin again, from the offsets it holds in shared memory. Per chain, one thread
   per row counts the row's buckets (``ceil(L / bucket_entries)`` for a row of ``L >
   bucket_entries`` entries, else 1), two block-wide scans give each row's first item and,
   over the split rows only, its first workspace slot; a chain whose rows need more than
   ``max_extra`` extra items keeps every row whole. One thread per row then writes its
   items' entry counts and rows to shared memory, and one thread per item finds the item's
   place in the longest-first order (the items with more entries, plus those before it
   with as many: a stable sort of at most ``MAX_ITEMS`` keys, one pass over them from
   shared memory, read as broadcasts) and stores its six fields there, after the
   ``R + 1`` offsets.

Reads and writes stay in bounds for any metadata: slots are read only within the arrays'
extents, an id is clipped into ``[0, N_kv)`` before it addresses the bitmap, and each
active slot sets at most one bit, so ``offsets[R]``, the number of set bits, is at most the
``B H_q N_q K_max`` entry slots (at most ``MAX_SLOTS``, so that int32 indices and
loop counters do not wrap). Plain loads and stores, shared-memory atomics and one
cluster barrier: sm_90+.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .bsa_det_order import atom_or_shared_b32
from .common import fence_acq_rel_gpu

#: CTAs of the one cluster (the portable cluster size)
CLUSTER = 8
#: threads per CTA
NUM_THREADS = 1024
#: most bitmap words of one chain in shared memory (``N_kv ceil(G N_q / 32)``) and most CSR
#: rows ``R``: 96 KiB each, so one CTA needs at most about 192 KiB without the work items
#: (with them :func:`fits` also checks the total against :data:`SMEM_LIMIT`)
MAX_WORDS = 24 * 1024
MAX_ROWS = 24 * 1024 - 1
#: most list slots ``B H_q N_q K_max``: every slot index, and the loop counters that pass the
#: last slot by up to ``CLUSTER NUM_THREADS``, stay below 2**31 (int32 index arithmetic)
MAX_SLOTS = 1 << 30
#: list slots a thread loads at once in the bitmap pass
SLOTS = 8
#: rows a warp takes at once in the entries pass
ROWS = 4
#: most work items per chain with ``bucket_entries`` (the longest-first order compares every
#: pair of a chain's items)
MAX_ITEMS = 2048
#: fields per work item (``metadata.KQ_ITEM_FIELDS``)
ITEM_FIELDS = 6
#: shared memory a CTA may use (sm_90's 227 KiB less 1 KiB for the arrays' alignment)
SMEM_LIMIT = 226 * 1024


def smem_bytes(n_kv: int, n_words: int, n_rows: int, n_items: int = 0) -> int:
    """Shared memory of one CTA (before alignment padding); ``n_items``: work items per
    chain with ``bucket_entries`` (0 without)."""
    items = 4 * (2 * (n_kv + 1) + 2 * n_items) + 64 if n_items else 0
    return 4 * n_kv * n_words + 4 * (n_rows + 1) + 4 * 32 + 64 + items


def fits(n_kv: int, group: int, n_q: int, n_rows: int, n_slots: int = 1,
         n_items: int = 0) -> bool:
    """Whether the kernel takes a call with these sizes (else ``metadata.build_kq_csr``);
    ``n_items``: work items per chain with ``bucket_entries`` (else
    ``metadata.kq_bucket_items``), at most :data:`MAX_ITEMS`."""
    n_words = -(-group * n_q // 32)
    return (n_kv >= 1 and n_q >= 1 and n_kv * n_words <= MAX_WORDS and 1 <= n_rows <= MAX_ROWS
            and 1 <= n_slots <= MAX_SLOTS and n_items <= MAX_ITEMS
            and (not n_items or n_items >= n_kv)
            and smem_bytes(n_kv, n_words, n_rows, n_items) <= SMEM_LIMIT)


class BsaKqLists:
    """``(idx, nums) -> (offsets, entries, words, counts)``: ``idx`` the flat int32
    ``q2k_block_index`` (``B H_q N_q K_max``), ``nums`` the flat int32 ``q2k_block_nums``
    (``B H_q N_q``); ``offsets`` ``(R + 1,)`` and ``entries`` ``(B H_q N_q K_max,)`` the K->Q
    lists (module docstring); ``words`` ``(R W,)`` and ``counts`` ``(R,)`` scratch (the
    bitmap and row lengths, read back by the cluster).

    ``bucket_entries`` > 0: ``offsets`` is ``(R + 1 + n_chains (n_kv + max_extra) 6,)``, the
    offsets followed by ``metadata.kq_bucket_items`` of them with these ``bucket_entries``
    and ``max_extra`` (module docstring, step 4)."""

    def __init__(self, n_chains: int, group: int, n_q: int, n_kv: int, k_max: int,
                 bucket_entries: int = 0, max_extra: int = 0):
        if (min(n_chains, group, n_q, n_kv, k_max) < 1 or min(bucket_entries, max_extra) < 0
                or max(bucket_entries, max_extra) > 2**31 - 1):
            raise ValueError(f"bsa_kq_lists: n_chains={n_chains}, group={group}, n_q={n_q}, "
                             f"n_kv={n_kv}, k_max={k_max} must be >= 1, bucket_entries="
                             f"{bucket_entries} and max_extra={max_extra} in [0, 2^31 - 1]")
        self.n_chains, self.group, self.n_q, self.n_kv, self.k_max = (n_chains, group, n_q,
                                                                      n_kv, k_max)
        self.width = group * n_q                    # query rows of a chain
        self.n_words = -(-self.width // 32)         # bitmap words per KV block
        self.n_rows = n_chains * n_kv               # CSR rows
        self.n_slots = n_chains * self.width * k_max
        self.bucket_entries, self.max_extra = bucket_entries, max_extra
        self.n_items = n_kv + max_extra if bucket_entries else 0   # work items per chain
        if not fits(n_kv, group, n_q, self.n_rows, self.n_slots, self.n_items):
            raise ValueError(f"bsa_kq_lists: {n_kv} KV blocks x {self.n_words} words, "
                             f"{self.n_rows} rows, {self.n_slots} slots and {self.n_items} "
                             f"work items per chain exceed the kernel's shared memory or "
                             f"int32 indexing")
        self.chunks = -(-self.n_words // 32)         # 32-word chunks of a row

    @cute.jit
    def __call__(self, mIdx, mNums, mOffsets, mEntries, mWords, mCounts, stream):
        @cute.struct
        class SmemLists:
            bits: cute.struct.Align[cute.struct.MemRange[Int32, self.n_kv * self.n_words], 16]
            offs: cute.struct.Align[cute.struct.MemRange[Int32, self.n_rows + 1], 16]
            warp_sums: cute.struct.Align[cute.struct.MemRange[Int32, 32], 16]

        # with the work items: per row of the chain its buckets, then its first item (nb)
        # and its first workspace slot (first); per item its entry count (key) and row
        @cute.struct
        class SmemItems:
            bits: cute.struct.Align[cute.struct.MemRange[Int32, self.n_kv * self.n_words], 16]
            offs: cute.struct.Align[cute.struct.MemRange[Int32, self.n_rows + 1], 16]
            warp_sums: cute.struct.Align[cute.struct.MemRange[Int32, 32], 16]
            nb: cute.struct.Align[cute.struct.MemRange[Int32, self.n_kv + 1], 16]
            first: cute.struct.Align[cute.struct.MemRange[Int32, self.n_kv + 1], 16]
            key: cute.struct.Align[cute.struct.MemRange[Int32, max(self.n_items, 1)], 16]
            row: cute.struct.Align[cute.struct.MemRange[Int32, max(self.n_items, 1)], 16]

        Smem = SmemItems if self.n_items else SmemLists
        self.kernel(mIdx, mNums, mOffsets, mEntries, mWords, mCounts, Smem).launch(
            grid=(CLUSTER, 1, 1), block=[NUM_THREADS, 1, 1], cluster=(CLUSTER, 1, 1),
            smem=Smem.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, mIdx, mNums, mOffsets, mEntries, mWords, mCounts, Smem: cutlass.Constexpr):
        tid, _, _ = cute.arch.thread_idx()
        cta = cute.arch.block_idx_in_cluster()
        lane = tid % 32
        warp = tid // 32
        n_kv, nw, width, k_max = self.n_kv, self.n_words, self.width, self.k_max
        n_rows, nt = self.n_rows, NUM_THREADS
        st = cutlass.memory.SmemAllocator().allocate(Smem)
        sBits = st.bits.get_tensor(cute.make_layout(n_kv * nw))
        sOffs = st.offs.get_tensor(cute.make_layout(n_rows + 1))
        sWarp = st.warp_sums.get_tensor(cute.make_layout(32))

        # 1. each chain's bitmap, row lengths and words
        for c in cutlass.range(cta, self.n_chains, CLUSTER, unroll=1):
            for i in cutlass.range(tid, n_kv * nw, nt, unroll=1):
                sBits[i] = Int32(0)
            cute.arch.barrier()
            slot0 = c * (width * k_max)
            row0 = c * width
            n_slots_c = width * k_max
            # SLOTS slots per thread at a time: their loads are issued together, before
            # the atomics (an asm statement, which the loads are not moved across)
            for s0 in cutlass.range(tid, n_slots_c, nt * SLOTS, unroll=1):
                rKv = cute.make_rmem_tensor((SLOTS,), Int32)
                rCol = cute.make_rmem_tensor((SLOTS,), Int32)
                for v in cutlass.range_constexpr(SLOTS):
                    s = s0 + v * nt
                    sc = cutlass.min(s, n_slots_c - 1)  # in bounds; s past the end is dropped
                    col = sc // k_max
                    j = sc - col * k_max
                    cnt = cutlass.max(cutlass.min(Int32(mNums[row0 + col]), k_max), 0)
                    kv = Int32(mIdx[slot0 + sc])
                    keep = Int32(-1)
                    if s < n_slots_c:
                        if j < cnt:
                            # ids clipped to [0, N_kv), as sanitize_bsa_metadata does
                            keep = cutlass.max(cutlass.min(kv, n_kv - 1), 0)
                    rKv[v] = keep
                    rCol[v] = col
                for v in cutlass.range_constexpr(SLOTS):
                    if rKv[v] >= 0:
                        col = rCol[v]
                        atom_or_shared_b32(st.bits.data_ptr() + ((col >> 5) * n_kv + rKv[v]),
                                           Int32(1) << (col & 31))
            cute.arch.barrier()
            for n in cutlass.range(tid, n_kv, nt, unroll=1):
                length = Int32(0)
                for w in cutlass.range(nw, unroll=1):
                    x = Int32(sBits[w * n_kv + n])
                    length += cute.arch.popc(x)
                    mWords[(c * nw + w) * n_kv + n] = x
                mCounts[c * n_kv + n] = length
            cute.arch.barrier()

        # 2. every chain's words and lengths visible to every CTA of the cluster
        fence_acq_rel_gpu()
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

        # 3a. exclusive scan of the R lengths
        for r in cutlass.range(tid, n_rows, nt, unroll=1):
            sOffs[r] = Int32(mCounts[r])
        cute.arch.barrier()
        self._scan(sOffs, n_rows, sWarp, tid)

        # 3b. offsets, entries and the zeroed tail, over the cluster's threads
        g = cta * nt + tid
        for r in cutlass.range(g, n_rows + 1, CLUSTER * nt, unroll=1):
            mOffsets[r] = Int32(sOffs[r])
        # entries: one warp per row (ROWS rows at a time, their word loads issued
        # together: each lane one word of a 32-word chunk), then word by word, each lane
        # one bit, so the lanes of a store write neighbouring places of one row
        nwarps = nt // 32
        step = CLUSTER * nwarps
        rRun = cute.make_rmem_tensor((ROWS,), Int32)
        rBase = cute.make_rmem_tensor((ROWS,), Int32)
        below = (Int32(1) << lane) - 1  # this lane's bits below its own
        for rb in cutlass.range(cta * nwarps + warp, n_rows, step * ROWS, unroll=1):
            for u in cutlass.range_constexpr(ROWS):
                rc = cutlass.min(rb + u * step, n_rows - 1)
                c = rc // n_kv
                rRun[u] = Int32(sOffs[rc])
                rBase[u] = c * nw * n_kv + (rc - c * n_kv)  # word 0 of the row in mWords
            for ch in cutlass.range(self.chunks, unroll=1):
                w = ch * 32 + lane
                rX = cute.make_rmem_tensor((ROWS,), Int32)
                for u in cutlass.range_constexpr(ROWS):
                    x = Int32(0)
                    if rb + u * step < n_rows:
                        if w < nw:
                            x = Int32(mWords[rBase[u] + w * n_kv])
                    rX[u] = x
                for u in cutlass.range_constexpr(ROWS):
                    # the chunk's words one at a time, broadcast from the lane holding it:
                    # lane l writes the entry of the word's bit l, at the row's running
                    # count plus the word's set bits below bit l (neighbouring places)
                    xl = rX[u]
                    run = rRun[u]
                    for i in cutlass.range(cutlass.min(nw - ch * 32, 32), unroll=1):
                        x = cute.arch.shuffle_sync(xl, i)
                        if ((x >> lane) & 1) != 0:
                            mEntries[run + cute.arch.popc(x & below)] = (ch * 32 + i) * 32 + lane
                        run += cute.arch.popc(x)
                    rRun[u] = run
        total = Int32(sOffs[n_rows])
        for i in cutlass.range(total + g, self.n_slots, CLUSTER * nt, unroll=1):
            mEntries[i] = Int32(0)

        # 4. the work items of the bucket split, from the offsets in shared memory
        if cutlass.const_expr(self.n_items > 0):
            self._items(st, sOffs, sWarp, mOffsets, tid, cta)

    @cute.jit
    def _scan(self, sArr, n: cutlass.Constexpr, sWarp, tid):
        """``sArr[0:n]`` replaced by its exclusive prefix sums and ``sArr[n]`` set to their
        total (every thread of the CTA; ends with a barrier): thread ``t`` sums its
        ``ceil(n / NUM_THREADS)`` consecutive values, warp shuffles and one warp over the
        warps' sums give its exclusive prefix, and the last thread's running sum is the
        total."""
        nt = NUM_THREADS
        lane = tid % 32
        warp = tid // 32
        rpt = -(-n // nt)
        r0 = tid * rpt
        mine = Int32(0)
        for i in cutlass.range(rpt, unroll=1):
            if r0 + i < n:
                mine += Int32(sArr[r0 + i])
        incl = mine
        for k in cutlass.range_constexpr(5):
            up = cute.arch.shuffle_sync_up(incl, offset=1 << k)
            if lane >= (1 << k):
                incl += up
        if lane == 31:
            sWarp[warp] = incl
        cute.arch.barrier()
        if warp == 0:
            v = Int32(sWarp[lane])
            vi = v
            for k in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(vi, offset=1 << k)
                if lane >= (1 << k):
                    vi += up
            sWarp[lane] = vi - v
        cute.arch.barrier()
        run = Int32(sWarp[warp]) + incl - mine
        for i in cutlass.range(rpt, unroll=1):
            if r0 + i < n:
                x = Int32(sArr[r0 + i])
                sArr[r0 + i] = run
                run += x
        if tid == nt - 1:
            sArr[n] = run
        cute.arch.barrier()

    @cute.jit
    def _items(self, st, sOffs, sWarp, mOffsets, tid, cta):
        """Step 4 (module docstring): ``metadata.kq_bucket_items`` of the offsets in
        ``sOffs``, stored to ``mOffsets`` after its ``R + 1`` offsets."""
        nt = NUM_THREADS
        n_kv, n_items, n_b = self.n_kv, self.n_items, self.bucket_entries
        extra = self.max_extra
        sNb = st.nb.get_tensor(cute.make_layout(n_kv + 1))
        sFirst = st.first.get_tensor(cute.make_layout(n_kv + 1))
        sKey = st.key.get_tensor(cute.make_layout(n_items))
        sRow = st.row.get_tensor(cute.make_layout(n_items))
        out0 = self.n_rows + 1
        for c in cutlass.range(cta, self.n_chains, CLUSTER, unroll=1):
            base = c * n_kv
            # buckets per row, and the split rows' bucket counts (0 for a row kept whole)
            for n in cutlass.range(tid, n_kv, nt, unroll=1):
                length = Int32(sOffs[base + n + 1]) - Int32(sOffs[base + n])
                nb = Int32(1)
                if length > n_b:
                    nb = (length - 1) // n_b + 1
                sNb[n] = nb
                sFirst[n] = nb if nb > 1 else Int32(0)
            cute.arch.barrier()
            self._scan(sNb, n_kv, sWarp, tid)
            self._scan(sFirst, n_kv, sWarp, tid)
            # a chain needing more than max_extra extra items keeps every row whole
            used = Int32(sNb[n_kv])
            split = used - n_kv <= extra
            if not split:
                used = Int32(n_kv)
            # each row's items: entry count and row
            for n in cutlass.range(tid, n_kv, nt, unroll=1):
                length = Int32(sOffs[base + n + 1]) - Int32(sOffs[base + n])
                i0 = n
                nb = Int32(1)
                if split:
                    i0 = Int32(sNb[n])
                    nb = Int32(sNb[n + 1]) - i0
                q = length // nb
                rem = length - q * nb
                for b in cutlass.range(nb, unroll=1):
                    cnt = q
                    if b < rem:
                        cnt = q + 1
                    sKey[i0 + b] = cnt
                    sRow[i0 + b] = n
            for i in cutlass.range(used + tid, n_items, nt, unroll=1):
                sKey[i] = Int32(-1)  # unused: after every used item
                sRow[i] = Int32(-1)
            cute.arch.barrier()
            # each item's place longest first (ties in item order) and its fields
            for i in cutlass.range(tid, n_items, nt, unroll=1):
                key = Int32(sKey[i])
                # the items before this one with at least as many entries, those after it
                # with more
                rank = Int32(0)
                for j in cutlass.range(i, unroll=4):
                    if Int32(sKey[j]) >= key:
                        rank += 1
                for j in cutlass.range(i + 1, n_items, unroll=4):
                    if Int32(sKey[j]) > key:
                        rank += 1
                n = Int32(sRow[i])
                f_row, f_lo, f_cnt = Int32(-1), Int32(0), Int32(0)
                f_slot, f_first, f_nb = Int32(-1), Int32(-1), Int32(0)
                if n >= 0:
                    i0 = n
                    nb = Int32(1)
                    if split:
                        i0 = Int32(sNb[n])
                        nb = Int32(sNb[n + 1]) - i0
                    b = i - i0
                    length = Int32(sOffs[base + n + 1]) - Int32(sOffs[base + n])
                    q = length // nb
                    rem = length - q * nb
                    f_row = base + n
                    f_lo = Int32(sOffs[base + n]) + b * q + cutlass.min(b, rem)
                    f_cnt = key
                    f_nb = nb
                    if nb > 1:
                        f_first = c * (2 * extra) + Int32(sFirst[n])
                        f_slot = f_first + b
                o = out0 + (c * n_items + rank) * ITEM_FIELDS
                mOffsets[o] = f_row
                mOffsets[o + 1] = f_lo
                mOffsets[o + 2] = f_cnt
                mOffsets[o + 3] = f_slot
                mOffsets[o + 4] = f_first
                mOffsets[o + 5] = f_nb
            cute.arch.barrier()
