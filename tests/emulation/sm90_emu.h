// sm90_emu.h: the sm_90a emulation the wgmma attention kernels' emulators share
// (flash_fwd_sm90_emulator.cpp: the forwards; flash_bwd_sm90_emulator.cpp: the backward), on top of
// emu_common.h's fibers, shared-memory hazard bookkeeping, cp.async and barriers. Emulated from the
// PTX ISA's description, independently of the kernels' own index arithmetic:
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} (any N the kernels use: 32 .. 256) with A from
//     shared memory (K-major, or MN-major: imm-trans-a) or registers and B from shared memory, K-major
//     or MN-major (imm-trans-b); the 64-bit shared-memory matrix descriptor decoded field by field
//     (start address, LBO, SBO, base offset, swizzle mode) and every operand element fetched through
//     the canonical layout of its swizzle mode (none / 32 / 64 / 128-byte: the 16-byte-chunk bits 4..
//     of the address XORed with bits 7..), register fragments per the ISA's tables (A: row
//     16w + g + 8·(r % 2), k 2t + h + 8·(r / 2) for register r, half h; D: row 16w + g + 8·((i / 2) % 2),
//     column 8·(i / 4) + 2t + i % 2 for register i; w the warp of the warpgroup, g = lane / 4, t = lane % 4);
//   wgmma.fence / commit_group / wait_group: an mma issued after a wait (or first) without a fence
//     fails; at issue the accumulator registers are overwritten with a NaN poison until the wait that
//     completes the op (so a read before the wait shows as NaN in the output), a write to them or to
//     the A fragment before that wait fails; the shared operands are snapshotted at issue and must be
//     unchanged when the last thread of the warpgroup has waited (and no store may target them while
//     in flight); descriptors and scale-d must be uniform over the warpgroup; 128 threads take part;
//     wgmma reads through the async proxy: a byte last written by the generic proxy (st.shared,
//     cp.async) must have been fenced (fence.proxy.async) by its writer, and a barrier must separate
//     the write and the read;
//   mbarrier init / arrive / arrive.expect_tx / try_wait.parity (phases, arrival and tx counts), TMA
//     tile loads (cp.async.bulk.tensor.4d, 128-byte swizzle, zero fill out of bounds, completion at a
//     random later scheduling round; a reader must have waited for the phase its bytes complete),
//     setmaxnreg (a warpgroup collective);
//   TMA reduce-adds (cp.reduce.async.bulk.tensor.4d from shared memory into a registered float32
//     buffer only; bulk groups: the source is read at the issuing thread's wait_group.read, and no
//     thread may overwrite it before);
//   bar.sync id, threads (named barriers: see named_barrier_sync for what the hazard checks assume).
// The hooks emu_common.h declares are defined here. Include once, after defining EMU_KERNEL_NAMESPACE
// as flash_fwd_sm90 (the namespace of the kernels' PTX wrappers) and before the kernel headers; each
// emulator then defines its launchers (launch_grid over the kernel) and its cases.
// Sources for the emulated semantics: PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"
// (register fragments, shared memory matrix layout, matrix descriptor, strides, wgmma.fence /
// commit_group / wait_group), "mbarrier", "cp.async.bulk.tensor", "bar.sync", "red" and "Memory
// Consistency Model" (proxies); CUTLASS's canonical-layout table (cute/atom/mma_traits_sm90_gmma.hpp,
// make_gmma_desc) was read to cross-check LBO / SBO roles.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <set>

#ifndef EMU_KERNEL_NAMESPACE
#define EMU_KERNEL_NAMESPACE flash_fwd_sm90
#endif
#include "emu_common.h"

// Device built-ins the sm90 kernels use beside emu_common.h's, on the host.
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace emu {

struct WgmmaOp;  // below

// Per thread: its wgmma state (beside emu_common.h's Fiber).
struct WgState {
  bool fenced = false;                                          // wgmma.fence since the last wait (or start)
  std::vector<std::shared_ptr<WgmmaOp>> wg_open;                // issued, not committed
  std::deque<std::vector<std::shared_ptr<WgmmaOp>>> wg_groups;  // committed, not complete
  std::map<float*, int> acc_in_flight;                          // accumulator array -> ops in flight on it
  // Bulk reduce-adds (cp.reduce.async.bulk.tensor) of this thread: per element its shared source and
  // global destination (null: outside the tensor, skipped); issued, then committed groups.
  using BulkOp = std::vector<std::pair<uint32_t, float*>>;
  std::vector<BulkOp> bulk_open;
  std::deque<std::vector<BulkOp>> bulk_groups;
};
std::vector<WgState> g_wg;                        // per thread of the block
std::vector<Collective> g_warpgroups;             // per warpgroup: its wgmma rendezvous
std::vector<std::shared_ptr<WgmmaOp>> g_wg_made;  // per warpgroup: a wgmma collective's op, handed from
                                                  // the computing thread to the others

inline WgState& cur_wg() { return g_wg[cur().tid]; }

// ---------------------------------------------------------------- mbarrier and TMA (state)
// An mbarrier by its shared address: the expected arrival count, arrivals and transaction bytes still
// owed to the running phase, and how many phases have completed (the running phase's number).
struct Mbar {
  int count = 0, pending = 0;
  long tx = 0, completed = 0;
  std::vector<int> waiters;  // threads blocked in try_wait on it
};
std::map<uint32_t, Mbar> g_mbars;
std::vector<std::map<uint32_t, long>> g_observed;  // per thread: phases it saw complete, per barrier
// A TMA box in flight: its destination bytes (swizzled already) and their values, its barrier.
struct TmaCopy {
  std::vector<std::pair<uint32_t, uint8_t>> bytes;
  uint32_t bar;
};
std::deque<TmaCopy> g_tma;
std::mt19937 g_tma_rng(99);

// A named barrier (bar.sync id, threads): the threads arrived in the running phase, the count they
// named, how many phases completed.
struct NamedBarrier {
  int arrived = 0, threads = 0;
  bool arrive_only = false;  // a bar.arrive counted in the running phase (named_barrier_count)
  long generation = 0;
  std::vector<int> waiters;
};
NamedBarrier g_named[16];
// setmaxnreg's register pool (setmaxnreg below).
int g_reg_pool = 0;                 // registers a dec returned and no inc has taken, per CTA
std::vector<int> g_wg_regs;         // per warpgroup: its threads' count now
std::vector<int> g_wg_inc_waiting;  // per warpgroup: the count its pending inc asks for (0: none)
std::vector<int> g_reg_waiters;     // threads blocked in an inc

// A barrier is no place for uncommitted wgmma ops (a commit_group after it would not cover them).
inline void check_no_open_wgmma(const std::string& barrier) {
  if (!cur_wg().wg_open.empty()) fail(barrier + " with uncommitted wgmma ops");
}

// The hooks of emu_common.h.
void on_barrier() { check_no_open_wgmma("__syncthreads"); }
void on_block_start(int threads) {
  g_wg.assign(threads, WgState{});
  g_warpgroups.assign(threads / 128, Collective::make(128));
  g_reg_pool = 0;
  g_wg_regs.assign(threads / 128, std::min(255, 65536 / threads / 8 * 8));
  g_wg_inc_waiting.assign(threads / 128, 0);
  g_reg_waiters.clear();
  g_wg_made.assign(threads / 128, nullptr);
  g_mbars.clear();
  g_observed.assign(threads, {});
  g_tma.clear();
  for (NamedBarrier& n : g_named) n = NamedBarrier{};
}
void on_block_exit() {
  for (const WgState& w : g_wg) {
    if (!w.wg_groups.empty() || !w.wg_open.empty()) fail("thread exited with wgmma ops in flight");
    if (!w.bulk_groups.empty() || !w.bulk_open.empty())
      fail("the CTA exited with a bulk reduce-add that may not have read its shared source (no wait_group.read)");
  }
  for (int id = 0; id < 16; ++id)
    if (g_named[id].arrived) fail("the CTA exited with threads waiting at named barrier " + std::to_string(id));
  if (!g_tma.empty()) fail("the CTA exited with TMA copies in flight");
}

Mbar& mbar(uint32_t bar, const char* what) {
  auto it = g_mbars.find(bar);
  if (it == g_mbars.end()) fail(std::string(what) + ": not an initialized mbarrier");
  return it->second;
}
void mbar_check_phase(uint32_t bar, Mbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.completed;
    b.pending = b.count;
    for (int t : b.waiters) g_fibers[t].blocked = false;
    b.waiters.clear();
  }
}
void complete_tma(TmaCopy& c) {
  Mbar& b = mbar(c.bar, "TMA complete_tx");
  for (const auto& [addr, v] : c.bytes) {
    ByteState& s = g_bytes[addr];
    if (s.wgmma_readers) fail("a TMA lands on an operand of a wgmma still in flight");
    --s.pending;
    s.write_epoch = g_epoch;
    s.write_release = g_release_epoch;
    s.writer_warp = -3;
    s.writer_tid = -1;
    s.async_write = false;
    s.proxy_visible = true;  // written through the async proxy
    s.tma_bar = static_cast<int>(c.bar);
    s.tma_seq = b.completed + 1;  // the phase its bytes count toward
    s.read_epoch = -1;
    *host(addr, 1, "TMA") = v;
  }
  b.tx -= static_cast<long>(c.bytes.size());
  mbar_check_phase(c.bar, b);
}
// Each round a TMA in flight lands with probability 1/4 (oldest first is not assumed); when no thread
// can run, one lands.
void on_round() {
  for (size_t i = 0; i < g_tma.size();) {
    if (g_tma_rng() % 4 == 0) {
      TmaCopy c = std::move(g_tma[i]);
      g_tma.erase(g_tma.begin() + static_cast<long>(i));
      complete_tma(c);
    } else {
      ++i;
    }
  }
}
bool on_stall() {
  if (g_tma.empty()) return false;
  const size_t i = g_tma_rng() % g_tma.size();
  TmaCopy c = std::move(g_tma[i]);
  g_tma.erase(g_tma.begin() + static_cast<long>(i));
  complete_tma(c);
  return true;
}
bool observed(int tid, const ByteState& b) {
  const auto& m = g_observed[tid];
  auto it = m.find(static_cast<uint32_t>(b.tma_bar));
  return it != m.end() && it->second >= b.tma_seq;
}
void on_tma_byte(const ByteState& b, const char* what) {
  if (!observed(cur().tid, b))
    fail(std::string(what) + ": touches TMA data before this thread waited for the mbarrier phase it completes");
}

// ---------------------------------------------------------------- wgmma
// The shared-memory matrix descriptor, field by field (PTX ISA, "Matrix Descriptor Format").
struct Desc {
  uint32_t start, lbo, sbo;
  int base_offset, swizzle_bytes;  // 0: no swizzle ("interleave"), else 32 / 64 / 128
};
Desc decode(uint64_t d) {
  Desc r;
  r.start = static_cast<uint32_t>(d & 0x3FFF) << 4;
  r.lbo = static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4;
  r.sbo = static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4;
  r.base_offset = static_cast<int>((d >> 49) & 7);
  const int mode = static_cast<int>((d >> 62) & 3);
  r.swizzle_bytes = mode == 0 ? 0 : mode == 1 ? 128 : mode == 2 ? 64 : 32;
  if (r.base_offset != 0) fail("wgmma descriptor: base offset != 0 is not emulated (swizzle atoms must be aligned)");
  return r;
}

// Byte address of element (mn, k) of a 16-bit operand (mn: M row of A or N column of B; k < 16) in
// the canonical layouts (PTX ISA, "Shared Memory Matrix Layout" and "Strides"), in 16-byte units T:
//   K-major,  no swizzle: 8x1 core matrices of (8 rows x 16 bytes); rows 16 B apart, the next 8 rows
//             SBO away, the next 8 k (16 bytes) LBO away.
//   K-major,  swizzle S bytes: atoms of 8 rows x S bytes; rows S bytes apart, the next 8 rows SBO away;
//             k runs contiguously along the row (LBO unused: a k16 slice is 32 bytes <= S).
//   MN-major, no swizzle: core matrices of (8 k x 16 bytes of mn); mn contiguous within 16 bytes, the
//             next 8 mn SBO away; k rows 16 bytes apart, the next 8 k LBO away.
//   MN-major, swizzle S bytes: atoms of 8 k-rows x S bytes of mn; mn contiguous within S bytes, the
//             next S/2 mn LBO away; k rows S bytes apart, the next 8 k SBO away.
// Swizzle S: the 16-byte chunk index (address bits 4..) is XORed with the row within the repeating
// pattern (bits 7..), log2(S / 16) bits of each: applied to the address itself.
uint32_t element_addr(const Desc& d, bool k_major, int mn, int k) {
  uint32_t a;
  if (k_major) {
    if (d.swizzle_bytes == 0) a = d.start + (mn / 8) * d.sbo + (mn % 8) * 16 + (k / 8) * d.lbo + (k % 8) * 2;
    else a = d.start + (mn / 8) * d.sbo + (mn % 8) * d.swizzle_bytes + k * 2;
  } else {
    if (d.swizzle_bytes == 0) {
      a = d.start + (mn / 8) * d.sbo + (mn % 8) * 2 + (k / 8) * d.lbo + (k % 8) * 16;
    } else {
      const int per_row = d.swizzle_bytes / 2;  // mn elements in one swizzle row
      a = d.start + (mn / per_row) * d.lbo + (mn % per_row) * 2 + (k / 8) * d.sbo + (k % 8) * d.swizzle_bytes;
    }
  }
  if (d.swizzle_bytes) {
    const uint32_t mask = d.swizzle_bytes / 16 - 1;
    a ^= ((a >> 7) & mask) << 4;
  }
  return a;
}

struct WgmmaOp {
  int n = 0, wg = 0;
  std::vector<std::vector<float>> result;       // per thread of the warpgroup
  std::vector<std::pair<uint32_t, uint8_t>> snapshot;  // shared bytes read, with their values at issue
  std::vector<std::vector<uint32_t>> a_regs;    // per thread (register A)
  std::vector<float*> acc_ptr;                  // per thread
  std::vector<const uint32_t*> a_ptr;           // per thread (register A), or null
  int completed = 0;
};

uint32_t g_poison_bits = 0x7fc0dead;  // the NaN an accumulator holds while its wgmma is in flight

void wgmma_fence() { cur_wg().fenced = true; }

// One wgmma.mma_async: acc is this thread's accumulator (n / 2 floats), a_regs its A fragment (null:
// A from desc_a), tnsp_b: B is MN-major, tnsp_a: A (from desc_a) is MN-major. T: __half or __nv_bfloat16.
template <typename T>
void wgmma(int n, float* acc, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, int scale_d, int tnsp_b,
           int tnsp_a = 0) {
  if (n < 8 || n > 256 || n % 8) fail("wgmma: N not a multiple of 8 in [8, 256]");
  if (a_regs && tnsp_a) fail("wgmma: imm-trans-a with A from registers");
  const int tid = cur().tid;
  WgState& me = cur_wg();
  const int wg = tid / 128, wl = tid % 128;
  const int regs = n / 2;
  auto chained = me.acc_in_flight.find(acc);
  const bool chain = chained != me.acc_in_flight.end() && chained->second > 0;
  if (!chain && !me.fenced)
    fail("wgmma.mma_async without a wgmma.fence after the last wait_group (or before the first wgmma)");
  // The accumulator input: the array (or, chained on an op in flight, that op's result: resolved below).
  std::vector<float> c_in(acc, acc + regs);
  std::shared_ptr<WgmmaOp> prev;
  if (chain) {
    for (uint32_t i = 0; i < static_cast<uint32_t>(regs); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &acc[i], 4);
      if (bits != g_poison_bits) fail("accumulator register written while its wgmma was in flight");
    }
    for (auto it = me.wg_open.rbegin(); it != me.wg_open.rend() && !prev; ++it)
      if ((*it)->acc_ptr[wl] == acc) prev = *it;
    for (auto g = me.wg_groups.rbegin(); g != me.wg_groups.rend() && !prev; ++g)
      for (auto it = g->rbegin(); it != g->rend() && !prev; ++it)
        if ((*it)->acc_ptr[wl] == acc) prev = *it;
    if (!prev) fail("emulator: chained accumulator without its op");
    if (prev->n != n) fail("wgmma chained on an accumulator of another shape");
  }
  Collective& c = g_warpgroups[wg];
  c.in_l[wl * 2] = desc_a;
  c.in_l[wl * 2 + 1] = desc_b;
  c.in_u[wl].assign({static_cast<uint32_t>(scale_d != 0), 0, 0, 0, 0});
  if (a_regs) for (int r = 0; r < 4; ++r) c.in_u[wl][1 + r] = a_regs[r];
  c.in_f[wl] = prev ? prev->result[wl] : c_in;
  const std::string name = std::string("wgmma.m64n") + std::to_string(n) + (a_regs ? ".rs" : ".ss") +
                           (tnsp_a ? ".tnspA" : "") + (tnsp_b ? ".tnspB" : "") + (std::is_same<T, __half>::value ? ".f16" : ".bf16");
  collective(c, wg * 128, 128, name, [&](Collective& cc) {
    auto o = std::make_shared<WgmmaOp>();
    o->n = n;
    o->wg = wg;
    std::set<std::pair<int, long>> tma_checked;
    for (int l = 1; l < 128; ++l) {
      if (cc.in_l[2 * l] != cc.in_l[0] || cc.in_l[2 * l + 1] != cc.in_l[1])
        fail("wgmma: descriptors differ across the warpgroup");
      if (cc.in_u[l][0] != cc.in_u[0][0]) fail("wgmma: scale-d differs across the warpgroup");
    }
    const bool use_c = cc.in_u[0][0] != 0;
    // A (64 x 16) and B (16 x n) as doubles.
    std::vector<double> A(64 * 16), B(16 * n);
    auto read16 = [&](uint32_t addr) {
      const unsigned char* p = host(addr, 2, "wgmma operand");
      for (int b = 0; b < 2; ++b) {
        const ByteState& s = g_bytes[addr + b];
        if (s.pending) fail("wgmma reads a cp.async (or TMA) destination still in flight");
        if (s.write_epoch < 0) fail("wgmma reads shared memory never written");
        if (s.tma_bar >= 0) {
          const auto key = std::make_pair(s.tma_bar, s.tma_seq);
          if (!tma_checked.count(key)) {
            for (int l = 0; l < 128; ++l)
              if (!observed(wg * 128 + l, s)) fail("wgmma reads TMA data before every thread of the warpgroup waited for its mbarrier phase");
            tma_checked.insert(key);
          }
        } else if (s.write_epoch == g_epoch) {
          fail("wgmma reads data written with no __syncthreads in between");
        }
        if (!s.proxy_visible)
          fail("wgmma reads data written through the generic proxy without fence.proxy.async by its writer");
        o->snapshot.push_back({addr + b, p[b]});
      }
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    };
    if (a_regs) {
      // Register A fragment: thread (warp w, lane: g = lane / 4, t = lane % 4), register r, half h
      // (h = 0: low 16 bits) holds row 16w + g + 8·(r % 2), k 2t + h + 8·(r / 2).
      for (int l = 0; l < 128; ++l) {
        const int w = l / 32, g = (l % 32) / 4, t = l % 4;
        for (int r = 0; r < 4; ++r) {
          for (int h = 0; h < 2; ++h) {
            const uint16_t bits = static_cast<uint16_t>(h ? cc.in_u[l][1 + r] >> 16 : cc.in_u[l][1 + r] & 0xffff);
            A[(16 * w + g + 8 * (r % 2)) * 16 + 2 * t + h + 8 * (r / 2)] = to_double<T>(bits);
          }
        }
      }
    } else {
      const Desc da = decode(cc.in_l[0]);  // A from shared memory: K-major, or MN-major (imm-trans-a = 1)
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) A[m * 16 + k] = to_double<T>(read16(element_addr(da, !tnsp_a, m, k)));
    }
    const Desc db = decode(cc.in_l[1]);
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < 16; ++k) B[k * n + j] = to_double<T>(read16(element_addr(db, !tnsp_b, j, k)));
    // D: thread (w, g, t), register i: row 16w + g + 8·((i / 2) % 2), column 8·(i / 4) + 2t + i % 2.
    o->result.assign(128, std::vector<float>(regs));
    for (int l = 0; l < 128; ++l) {
      const int w = l / 32, g = (l % 32) / 4, t = l % 4;
      for (int i = 0; i < regs; ++i) {
        const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
        double d = use_c ? static_cast<double>(cc.in_f[l][i]) : 0.0;
        for (int k = 0; k < 16; ++k) d += A[row * 16 + k] * B[k * n + col];
        o->result[l][i] = static_cast<float>(d);
      }
    }
    for (const auto& [addr, v] : o->snapshot) ++g_bytes[addr].wgmma_readers;
    o->acc_ptr.assign(128, nullptr);
    o->a_ptr.assign(128, nullptr);
    o->a_regs.assign(128, {});
    g_wg_made[wg] = o;
  });
  std::shared_ptr<WgmmaOp> op = g_wg_made[wg];
  op->acc_ptr[wl] = acc;
  op->a_ptr[wl] = a_regs;
  if (a_regs) op->a_regs[wl].assign(a_regs, a_regs + 4);
  for (int i = 0; i < regs; ++i) std::memcpy(&acc[i], &g_poison_bits, 4);
  ++me.acc_in_flight[acc];
  me.wg_open.push_back(op);
}

void wgmma_commit() {
  cur_wg().wg_groups.push_back(std::move(cur_wg().wg_open));
  cur_wg().wg_open.clear();
}

void wgmma_wait(int n) {
  const int tid = cur().tid;
  WgState& me = cur_wg();
  const int wl = tid % 128;
  if (!me.wg_open.empty()) fail("wgmma.wait_group with uncommitted wgmma ops (they would not be waited for)");
  while (static_cast<int>(me.wg_groups.size()) > n) {
    for (auto& op : me.wg_groups.front()) {
      float* acc = op->acc_ptr[wl];
      for (int i = 0; i < op->n / 2; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &acc[i], 4);
        if (bits != g_poison_bits) fail("accumulator register written while its wgmma was in flight");
      }
      if (op->a_ptr[wl] && !std::equal(op->a_regs[wl].begin(), op->a_regs[wl].end(), op->a_ptr[wl]))
        fail("A fragment register written while its wgmma was in flight");
      if (--me.acc_in_flight[acc] == 0) std::memcpy(acc, op->result[wl].data(), 4 * (op->n / 2));
      if (++op->completed == 128) {  // the whole warpgroup waited: the operands may change now
        for (const auto& [addr, v] : op->snapshot) {
          ByteState& s = g_bytes[addr];
          --s.wgmma_readers;
          if (*host(addr, 1, "wgmma operand") != v) fail("a wgmma's shared operand changed while it was in flight");
          s.read_epoch = g_epoch;
          s.reader_warp = -(10 + op->wg);
        }
        op->snapshot.clear();
      }
    }
    me.wg_groups.pop_front();
  }
  me.fenced = false;
}

// ---------------------------------------------------------------- mbarrier and TMA (operations)
std::vector<Buffer> g_red_buffers;  // where the bulk reduce-add may add (the backward's dq_accum)
// The emulator's CUtensorMap contents (encode_tile_map writes them; the 128 opaque bytes hold this).
struct EmuMap {
  uint32_t magic;
  uint32_t box_rows;
  uint32_t elem_bytes;  // 2 (the 16-bit operands) or 4 (float32: the backward's dQ accumulator)
  const unsigned char* base;
  uint64_t dims[4];
  uint64_t strides[3];  // bytes, dims 1..3
};
static_assert(sizeof(EmuMap) <= sizeof(CUtensorMap), "fits the opaque map");
constexpr uint32_t kMapMagic = 0x544d4150;

// A deliberate bug for the emulator's own test (tests/test_cuda_attention_sm90.py): with
// TILED_ATTN_EMU_MUTATE=short_count a barrier that counts several warpgroups' threads counts one
// warpgroup fewer (a consumer's slot release that does not wait for every consumer).
const bool g_mutate_short_count = [] {
  const char* m = std::getenv("TILED_ATTN_EMU_MUTATE");
  return m != nullptr && std::string(m) == "short_count";
}();
void mbar_init(uint32_t bar, int count) {
  if (bar % 8) fail("mbarrier.init: address not 8-byte aligned");
  host(bar, 8, "mbarrier.init");
  if (count < 1) fail("mbarrier.init: count < 1");
  if (g_mutate_short_count && count >= 256 && count % 128 == 0) count -= 128;
  Mbar b;
  b.count = b.pending = count;
  g_mbars[bar] = b;
}
void mbar_arrive(uint32_t bar, long tx) {
  Mbar& b = mbar(bar, "mbarrier.arrive");
  b.tx += tx;
  if (--b.pending < 0) fail("mbarrier.arrive: more arrivals than the barrier's count in one phase");
  mbar_check_phase(bar, b);
  // A plain arrive (a consumer freeing a slot) is a scheduling point: a waiter it releases may run
  // before the arriving thread goes on, so a slot freed before its readers completed is refilled
  // while they are in flight, and fails. (Not after arrive.expect_tx: the producer's own TMAs
  // follow it at once.)
  if (tx == 0) yield_now();
}
void mbar_wait(uint32_t bar, uint32_t parity) {
  for (;;) {
    Mbar& b = mbar(bar, "mbarrier.try_wait");
    if (parity > 1) fail("mbarrier.try_wait.parity: parity not 0 or 1");
    // Phase number `completed` is running; the phase of parity P last completed iff completed % 2 != P.
    if (static_cast<uint32_t>(b.completed % 2) != parity) {
      long& seen = g_observed[cur().tid][bar];
      seen = std::max(seen, b.completed);
      return;
    }
    b.waiters.push_back(cur().tid);
    yield_blocked();
  }
}
// A copy's map (the kernels' 128-byte-swizzled boxes of elem_bytes elements) and its shared box.
EmuMap box_map(const char* what, const CUtensorMap* tmap, uint32_t elem_bytes, uint32_t smem) {
  EmuMap m;
  std::memcpy(&m, tmap, sizeof m);
  if (m.magic != kMapMagic) fail(std::string(what) + ": not a tensor map encode_tile_map made");
  if (m.elem_bytes != elem_bytes)
    fail(std::string(what) + (elem_bytes == 2 ? ": the kernels load 16-bit operands only" : ": the kernels reduce float32 only"));
  if (smem % 128) fail(std::string(what) + ": shared box not 128-byte aligned (128-byte swizzle)");
  return m;
}
// Byte `byte` of row r of a box at shared `smem`: row r at 128·r, its 16-byte chunks XORed with address
// bits 7..9 (the 128-byte swizzle).
uint32_t box_byte(uint32_t smem, uint32_t r, uint32_t byte) {
  const uint32_t a = smem + r * 128 + byte;
  return a ^ (((a >> 7) & 7) << 4);
}
// The tensor's element at box element e of row r (coordinates c0 + e, c1 + r, c2, c3): its address, or
// null outside the tensor; an address outside `buffers` fails (`outside` says which).
unsigned char* map_element(const EmuMap& m, uint32_t e, uint32_t r, int c0, int c1, int c2, int c3,
                           const std::vector<Buffer>& buffers, const std::string& outside) {
  const int64_t idx[4] = {int64_t{c0} + e, int64_t{c1} + r, c2, c3};
  for (int i = 0; i < 4; ++i)
    if (idx[i] < 0 || idx[i] >= static_cast<int64_t>(m.dims[i])) return nullptr;
  unsigned char* g = const_cast<unsigned char*>(m.base) + idx[0] * m.elem_bytes + idx[1] * m.strides[0] +
                     idx[2] * m.strides[1] + idx[3] * m.strides[2];
  const char* pg = reinterpret_cast<const char*>(g);
  for (const Buffer& b : buffers)
    if (pg >= b.begin && pg + m.elem_bytes <= b.begin + b.bytes) return g;
  fail(outside);
}

void tma_load_4d(uint32_t dst, const CUtensorMap* tmap, uint32_t bar, int c0, int c1, int c2, int c3) {
  const EmuMap m = box_map("cp.async.bulk.tensor", tmap, 2, dst);
  mbar(bar, "cp.async.bulk.tensor");
  TmaCopy c;
  c.bar = bar;
  for (uint32_t r = 0; r < m.box_rows; ++r) {
    for (uint32_t e = 0; e < 64; ++e) {
      uint8_t v[2] = {0, 0};
      if (const unsigned char* src = map_element(m, e, r, c0, c1, c2, c3, g_inputs,
              "cp.async.bulk.tensor: the map reads outside the kernel's inputs (q/k/v[/dout])"))
        std::memcpy(v, src, 2);
      const uint32_t a = box_byte(dst, r, e * 2);
      for (int h = 0; h < 2; ++h) c.bytes.push_back({a + h, v[h]});
    }
  }
  for (const auto& [addr, v] : c.bytes) {
    host(addr, 1, "cp.async.bulk.tensor");
    ByteState& s = g_bytes[addr];
    if (s.wgmma_readers) fail("cp.async.bulk.tensor overwrites an operand of a wgmma still in flight");
    if (s.pending) fail("cp.async.bulk.tensor: two copies in flight to the same shared bytes");
    ++s.pending;
  }
  g_tma.push_back(std::move(c));
}
// cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.bulk_group: the box (32 float32 columns x
// box_rows, 128-byte swizzle by address) at shared `src` added into the map's tensor, elements outside
// it skipped. Its source must be readable by the async proxy now (every writer fenced, and a barrier
// between another thread's write and the issue); it is read when the issuing thread's wait_group.read
// covers its group, and until then no thread may overwrite it (check_byte_write).
void tma_reduce_add_4d(const CUtensorMap* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  const char* what = "cp.reduce.async.bulk.tensor";
  const EmuMap m = box_map(what, tmap, 4, src);
  WgState::BulkOp op;
  for (uint32_t r = 0; r < m.box_rows; ++r) {
    for (uint32_t e = 0; e < 32; ++e) {
      const uint32_t a = box_byte(src, r, e * 4);
      host(a, 4, what);
      for (uint32_t b = a; b < a + 4; ++b) {
        ByteState& s = g_bytes[b];
        if (s.pending) fail(std::string(what) + ": reads a cp.async (or TMA) destination still in flight");
        if (s.write_epoch < 0) fail(std::string(what) + ": reads shared memory never written");
        if (s.write_release == g_release_epoch && s.writer_tid != cur().tid)
          fail(std::string(what) + ": reads data another thread wrote with no barrier in between");
        if (!s.proxy_visible)
          fail(std::string(what) + ": reads data written through the generic proxy without fence.proxy.async by its writer");
        ++s.bulk_readers;
      }
      unsigned char* g = map_element(m, e, r, c0, c1, c2, c3, g_red_buffers,
                                     std::string(what) + ": the map adds outside the registered accumulator (dq_accum)");
      op.push_back({a, reinterpret_cast<float*>(g)});
    }
  }
  cur_wg().bulk_open.push_back(std::move(op));
}
void bulk_commit_group() {
  WgState& me = cur_wg();
  me.bulk_groups.push_back(std::move(me.bulk_open));
  me.bulk_open.clear();
}
// cp.async.bulk.wait_group.read n: the oldest groups past the newest n read their sources (and add).
// A deliberate bug for the backward emulator's own test: with TILED_ATTN_EMU_MUTATE=no_bulk_wait the
// wait returns at once (the reads stay pending until the CTA's last wait or its exit).
const bool g_mutate_no_bulk_wait = [] {
  const char* m = std::getenv("TILED_ATTN_EMU_MUTATE");
  return m != nullptr && std::string(m) == "no_bulk_wait";
}();
void bulk_wait_group_read(int n) {
  if (g_mutate_no_bulk_wait) n = std::max(n, static_cast<int>(cur_wg().bulk_groups.size()));
  // The reads happen as late as the wait allows: other threads run first (what the thread did since
  // its issue, e.g. a hand-over of the source, takes effect before the reduce has read it).
  if (static_cast<int>(cur_wg().bulk_groups.size()) > n) yield_now();
  WgState& me = cur_wg();
  while (static_cast<int>(me.bulk_groups.size()) > n) {
    for (const WgState::BulkOp& op : me.bulk_groups.front()) {
      for (const auto& [a, dst] : op) {
        float v;
        std::memcpy(&v, host(a, 4, "cp.reduce.async.bulk.tensor"), 4);
        if (dst) *dst += v;
        for (uint32_t b = a; b < a + 4; ++b) --g_bytes[b].bulk_readers;
      }
    }
    me.bulk_groups.pop_front();
  }
  yield_now();
}

// setmaxnreg: all 128 threads of the warpgroup take part (.sync.aligned); which registers the code
// needs is the compiler's business (ptxas -v in .ci/compile_csrc.sh). The counts move registers within
// the CTA's launch allocation, which __launch_bounds__(threads, 1) makes 64 K / threads rounded down to
// 8 a thread (168 at 384 threads; the kernels compile to that cap): a dec returns registers to the
// CTA's pool, an inc waits until the pool holds what it asks for. An inc no dec can satisfy hangs on
// the GPU (it did: session 30, 32 + 2 x 240 at 384 threads) and deadlocks here.
// A deliberate bug for the backward emulator's own test: with TILED_ATTN_EMU_MUTATE=greedy_inc every
// inc asks for 8 registers more than the kernel's count (past the launch allocation: a deadlock here).
const bool g_mutate_greedy_inc = [] {
  const char* m = std::getenv("TILED_ATTN_EMU_MUTATE");
  return m != nullptr && std::string(m) == "greedy_inc";
}();
void setmaxnreg(int regs, bool inc) {
  if (inc && g_mutate_greedy_inc) regs += 8;
  if (regs < 24 || regs > 256 || regs % 8) fail("setmaxnreg: count not a multiple of 8 in [24, 256]");
  const int wg = cur().tid / 128;
  collective(g_warpgroups[wg], wg * 128, 128, std::string("setmaxnreg.") + (inc ? "inc " : "dec ") + std::to_string(regs),
             [&](Collective&) {
               if (inc ? regs < g_wg_regs[wg] : regs > g_wg_regs[wg])
                 fail("setmaxnreg." + std::string(inc ? "inc" : "dec") + " " + std::to_string(regs) + " from " +
                      std::to_string(g_wg_regs[wg]) + ": the wrong direction");
               if (inc) {
                 g_wg_inc_waiting[wg] = regs;
               } else {
                 g_reg_pool += (g_wg_regs[wg] - regs) * 128;
                 g_wg_regs[wg] = regs;
                 for (int t : g_reg_waiters) g_fibers[t].blocked = false;
                 g_reg_waiters.clear();
               }
             });
  if (!inc) return;
  // Every thread of the warpgroup waits until the pool grants the warpgroup's inc (the first to see
  // enough takes it for all).
  while (g_wg_inc_waiting[wg] != 0) {
    const int need = (g_wg_inc_waiting[wg] - g_wg_regs[wg]) * 128;
    if (g_reg_pool >= need) {
      g_reg_pool -= need;
      g_wg_regs[wg] = g_wg_inc_waiting[wg];
      g_wg_inc_waiting[wg] = 0;
      break;
    }
    g_reg_waiters.push_back(cur().tid);
    yield_blocked();
  }
}

// ---------------------------------------------------------------- named barriers
// bar.sync id, threads: the first `threads` threads to arrive at barrier `id` are released together
// (per thread here; the hardware counts whole warps, so a warp must not diverge around it). For the
// hazard checks the phase's completion acts like __syncthreads (g_epoch advances), which is weaker than
// the real scope: data a thread outside the barrier wrote or read also counts as ordered by it, so a
// race between a participant and a non-participant (or between two non-participants) across it goes
// unseen. Id 0 is __syncthreads's barrier (not mixed here).
// A deliberate bug for the backward emulator's own test: with TILED_ATTN_EMU_MUTATE=short_named a
// named barrier releases half the threads it names (one consumer warpgroup of two, alone).
const bool g_mutate_short_named = [] {
  const char* m = std::getenv("TILED_ATTN_EMU_MUTATE");
  return m != nullptr && std::string(m) == "short_named";
}();
// bar.arrive id, threads (the forward's consumer ping-pong, the backward's dQ hand-off): counts the
// thread into the phase and goes on. What such a phase orders, here: the arrivers' shared-memory writes
// (fenced for the async proxy) before a bulk reduce-add the waiters issue after it (g_release_epoch:
// the backward's dQ buffers), nothing for generic accesses (g_epoch stays). compute-sanitizer's
// racecheck reported a generic store before a bar.arrive and a generic load after the bar.sync of its
// phase as a hazard (H200, session 30), so the kernels pass generic data through bar.sync phases only,
// and a kernel that does otherwise fails here too. A phase completed by arrivals alone (no thread
// waiting in it) is a failure: an arrive overran the bar.sync it was meant for (the hardware would
// start the next phase with the surplus).
// A deliberate bug for the forward emulator's own test: with TILED_ATTN_EMU_MUTATE=drop_arrive every
// bar.arrive is lost (a ping-pong whose hand-over never reaches the next consumer must deadlock here).
const bool g_mutate_drop_arrive = [] {
  const char* m = std::getenv("TILED_ATTN_EMU_MUTATE");
  return m != nullptr && std::string(m) == "drop_arrive";
}();
void named_barrier_count(int id, int threads, bool wait) {
  if (!wait && g_mutate_drop_arrive) return;
  const std::string what = std::string(wait ? "bar.sync " : "bar.arrive ") + std::to_string(id) + ", " +
                           std::to_string(threads);
  if (id < 1 || id > 15) fail(what + ": id not in 1..15");
  if (threads < 32 || threads % 32 || threads > static_cast<int>(g_fibers.size()))
    fail(what + ": thread count not a multiple of 32 within the block");
  if (g_mutate_short_named && threads % 64 == 0) threads /= 2;
  check_no_open_wgmma(what);
  NamedBarrier& b = g_named[id];
  if (b.arrived && b.threads != threads)
    fail(what + ": threads of one phase name different counts (" + std::to_string(b.threads) + ")");
  b.threads = threads;
  if (!wait) b.arrive_only = true;
  const long gen = b.generation;
  if (++b.arrived == threads) {
    if (!wait && b.waiters.empty()) fail(what + ": arrivals alone completed the phase (no thread waits in it)");
    if (!b.arrive_only) ++g_epoch;
    ++g_release_epoch;
    b.arrived = 0;
    b.arrive_only = false;
    ++b.generation;
    for (int t : b.waiters) g_fibers[t].blocked = false;
    b.waiters.clear();
  } else if (wait) {
    b.waiters.push_back(cur().tid);
    while (g_named[id].generation == gen) yield_blocked();
  }
}
void named_barrier_sync(int id, int threads) { named_barrier_count(id, threads, true); }
void named_barrier_arrive(int id, int threads) { named_barrier_count(id, threads, false); }

}  // namespace emu

// The kernels' PTX wrappers (csrc/attention/sm90/wgmma.cuh and tma.cuh, not compiled under
// TILED_ATTN_EMULATION) that emu_common.h has not defined.
// atomicAdd (global int): the persistent forward's tile counter (WsTraits::kDynamic). The CTAs run one
// after another here, so a read-modify-write is atomic as it stands.
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}

namespace tiled_attn {
namespace flash_fwd_sm90 {
inline void fence_proxy_async() { emu::proxy_fence(); }
inline void st_shared_b32(uint32_t addr, uint32_t v) { emu::st_shared(addr, &v, 4); }
inline void st_shared_f32x2(uint32_t addr, float a, float b) {
  const float v[2] = {a, b};
  emu::st_shared(addr, v, 8);
}
inline void st_shared_f32x4(uint32_t addr, float a, float b, float c, float d) {
  const float v[4] = {a, b, c, d};
  emu::st_shared(addr, v, 16);
}
inline uint4 ld_shared_b128(uint32_t addr) {
  uint4 v;
  emu::ld_shared(addr, &v, 16);
  return v;
}
inline float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  emu::ld_shared(addr, &v, 8);
  return v;
}
inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  emu::wgmma_wait(N);
}
inline void mbar_init(uint32_t bar, int count) { emu::mbar_init(bar, count); }
inline void mbar_fence_init() {}
inline void mbar_arrive(uint32_t bar) { emu::mbar_arrive(bar, 0); }
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) { emu::mbar_arrive(bar, bytes); }
inline void mbar_wait(uint32_t bar, uint32_t parity) { emu::mbar_wait(bar, parity); }
inline void tma_load_4d(uint32_t dst, const CUtensorMap* tmap, uint32_t bar, int c0, int c1, int c2, int c3) {
  emu::tma_load_4d(dst, tmap, bar, c0, c1, c2, c3);
}
inline void tma_reduce_add_4d(const CUtensorMap* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  emu::tma_reduce_add_4d(tmap, src, c0, c1, c2, c3);
}
inline void bulk_commit_group() { emu::bulk_commit_group(); }
template <int kGroups>
inline void bulk_wait_group_read() {
  emu::bulk_wait_group_read(kGroups);
}
template <int kRegs>
inline void setmaxnreg_inc() {
  emu::setmaxnreg(kRegs, true);
}
template <int kRegs>
inline void setmaxnreg_dec() {
  emu::setmaxnreg(kRegs, false);
}
template <int N>
inline void fence_operands(float (&)[N]) {}
template <int N>
inline void fence_operands(uint32_t (&)[N][4]) {}
inline void named_barrier_sync(int id, int threads) { emu::named_barrier_sync(id, threads); }
inline void named_barrier_arrive(int id, int threads) { emu::named_barrier_arrive(id, threads); }
// Any N (the emulation is generic in it); kTnspA: A (from desc_a) MN-major.
template <int N, typename T>
struct Wgmma {
  static constexpr int kRegs = N / 2;
  template <int kTnspB, int kTnspA = 0>
  static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    emu::wgmma<T>(N, d, nullptr, desc_a, desc_b, scale_d, kTnspB, kTnspA);
  }
  template <int kTnspB>
  static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    emu::wgmma<T>(N, d, a, 0, desc_b, scale_d, kTnspB);
  }
};

// encode_tile_map (flash_fwd_sm90_launch.cuh declares it, inline, under TILED_ATTN_EMULATION): the
// emulator's map, which tma_load_4d reads. cuTensorMapEncodeTiled's rules that matter here (CUDA driver API docs): a 16-byte aligned base,
// byte strides multiples of 16 below 2^40, dims in [1, 2^32], a box of at most 256 rows whose inner
// extent (one 128-byte swizzle row: 64 x 2 or 32 x 4 bytes) is at most the swizzle span.
inline bool encode_tile_map(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                            const uint64_t (&strides)[3], uint32_t box_rows, uint32_t elem_bytes) {
  if (reinterpret_cast<uintptr_t>(base) % 16 || (elem_bytes != 2 && elem_bytes != 4)) return false;
  for (uint64_t d : dims)
    if (d < 1 || d > (uint64_t{1} << 32)) return false;
  for (uint64_t s : strides)
    if (s % 16 || s >= (uint64_t{1} << 40)) return false;
  if (box_rows < 1 || box_rows > 256) return false;
  emu::EmuMap m{emu::kMapMagic, box_rows, elem_bytes, static_cast<const unsigned char*>(base), {dims[0], dims[1], dims[2], dims[3]},
                {strides[0], strides[1], strides[2]}};
  std::memset(static_cast<void*>(map), 0, sizeof(CUtensorMap));
  std::memcpy(static_cast<void*>(map), &m, sizeof m);
  return true;
}
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

// ------------------------------------------------------------------------------------------------
// Self-test of the descriptor decoding: element_addr against the layouts written out by hand for one
// small case of each kind (so a wrong table fails here, not as a mystery in the attention cases).
// ------------------------------------------------------------------------------------------------
namespace emu {
inline void check_layout_tables() {
  // K-major 128B: row r of the atom at 128·r, chunk c at c ^ (r % 8) (start 1024-aligned, k step 0).
  emu::Desc d{4096, 16, 1024, 0, 128};
  for (int mn = 0; mn < 64; ++mn)
    for (int k = 0; k < 16; ++k) {
      const uint32_t want = 4096 + (mn / 8) * 1024 + (mn % 8) * 128 + ((((k / 8) ^ (mn % 8)) * 16) | ((k % 8) * 2));
      if (emu::element_addr(d, true, mn, k) != want) emu::fail("self-test: K-major 128B layout");
    }
  // MN-major 128B: k row r at 128·r, mn chunk c at c ^ (r % 8), the next 64 mn LBO away.
  emu::Desc v{8192, 16384, 1024, 0, 128};
  for (int mn = 0; mn < 128; ++mn)
    for (int k = 0; k < 16; ++k) {
      const uint32_t want =
          8192 + (mn / 64) * 16384 + (k / 8) * 1024 + (k % 8) * 128 + (((((mn % 64) / 8) ^ (k % 8)) * 16) | ((mn % 8) * 2));
      if (emu::element_addr(v, false, mn, k) != want) emu::fail("self-test: MN-major 128B layout");
    }
  // K-major, no swizzle: 8 x 16-byte core matrices.
  emu::Desc i{0, 256, 512, 0, 0};
  if (emu::element_addr(i, true, 9, 10) != 512 + 16 + 256 + 4) emu::fail("self-test: K-major interleave layout");
}
}  // namespace emu
