// flash_fwd_sm90_emulator.cpp: runs csrc/attention/sm90/flash_fwd_sm90_kernel.cuh (the wgmma attention
// forward) on the CPU, unchanged, with every instruction it uses that a host compiler cannot run
// emulated here from the PTX ISA's description, independently of the kernel's own index arithmetic:
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} with A from shared memory or registers and B
//     from shared memory, K-major or MN-major (imm-trans-b); the 64-bit shared-memory matrix
//     descriptor decoded field by field (start address, LBO, SBO, base offset, swizzle mode) and every
//     operand element fetched through the canonical layout of its swizzle mode (none / 32 / 64 /
//     128-byte: the 16-byte-chunk bits 4.. of the address XORed with bits 7..), register fragments
//     per the ISA's tables (A: row 16w + g + 8·(r % 2), k 2t + h + 8·(r / 2) for register r, half h;
//     D: row 16w + g + 8·((i / 2) % 2), column 8·(i / 4) + 2t + i % 2 for register i; w the warp of
//     the warpgroup, g = lane / 4, t = lane % 4);
//   wgmma.fence / commit_group / wait_group: an mma issued after a wait (or first) without a fence
//     fails; at issue the accumulator registers are overwritten with a NaN poison until the wait that
//     completes the op (so a read before the wait shows as NaN in the output), a write to them or to
//     the A fragment before that wait fails; the shared operands are snapshotted at issue and must be
//     unchanged when the last thread of the warpgroup has waited (and no store may target them while
//     in flight); descriptors and scale-d must be uniform over the warpgroup; 128 threads take part;
//   cp.async (16 bytes, src-size zero fill) / commit_group / wait_group, fence.proxy.async.shared::cta
//     (wgmma reads through the async proxy: a byte last written by the generic proxy, st.shared or
//     cp.async, must have been fenced by its writer, and a barrier must separate the write and the read),
//     st.shared / ld.shared, shfl.xor, bar.sync (__syncthreads), with the race checks of
//     flash_fwd_emulator.cpp (a read of data another warp wrote, or a write over data another warp read,
//     with no barrier in between).
// The dynamic shared memory window starts at a random 16-byte-aligned address (not 1024-aligned), so
// a kernel that relies on the allocation's alignment for its 128-byte swizzle atoms fails here.
// Each CUDA thread is a ucontext fiber; a collective waits for its warp's (warpgroup's) threads, then
// computes every thread's result at once. Per case: output and lse against a float64 reference on
// the same rounded inputs (rows with no visible key: exactly 0 and -inf), no write outside out / lse.
//
// Build and run (CPU only; tests/test_cuda_attention_sm90.py does this):
//   g++ -std=c++17 -O1 -Wno-attributes -I<cuda>/include -Icsrc -DTILED_ATTN_EMULATION
//       tests/emulation/flash_fwd_sm90_emulator.cpp -o /tmp/flash_fwd_sm90_emulator && /tmp/flash_fwd_sm90_emulator
// Optional arguments: a head dim (0: all), a seed (inputs, thread schedule, shared-memory base).
// Sources for the emulated semantics: PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"
// (register fragments, shared memory matrix layout, matrix descriptor, strides, wgmma.fence /
// commit_group / wait_group) and "Memory Consistency Model" (proxies); CUTLASS's canonical-layout
// table (cute/atom/mma_traits_sm90_gmma.hpp, make_gmma_desc) was read to cross-check LBO / SBO roles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ------------------------------------------------------------------------------------------------
// Device built-ins the kernel and online_softmax.cuh use, on the host.
// ------------------------------------------------------------------------------------------------
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {
constexpr int kMaxSmem = 232448;         // the sm90 per-block opt-in limit (227 KB)
constexpr int kWindow = kMaxSmem + 1024;  // shared addresses: [base, base + bytes) with base < 1024
}  // namespace emu

// The kernel's `extern __shared__ unsigned char smem_raw[]` (a block-scope extern in this namespace).
namespace tiled_attn {
namespace flash_fwd_sm90 {
alignas(16) unsigned char smem_raw[emu::kMaxSmem];
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

namespace emu {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

unsigned char* const g_dyn = tiled_attn::flash_fwd_sm90::smem_raw;
uint32_t g_base = 0;    // shared-space address of smem_raw[0] this launch (16-byte aligned, < 1024)
int g_smem_bytes = 0;   // this launch's dynamic shared memory
int g_epoch = 0;        // __syncthreads completed in this block

// Host pointer of a shared address (checked against the allocation).
unsigned char* host(uint32_t addr, int bytes, const char* what) {
  if (addr < g_base || addr + bytes > g_base + static_cast<uint32_t>(g_smem_bytes))
    fail(std::string(what) + ": shared address " + std::to_string(addr) + " outside the dynamic allocation");
  return g_dyn + (addr - g_base);
}

struct ByteState {
  int write_epoch = -1, writer_warp = -1, writer_tid = -1;  // last completed write
  bool async_write = false;    // by cp.async: visible to any thread only after a barrier
  bool proxy_visible = false;  // the writer ran fence.proxy.async after the write (wgmma may read it)
  int read_epoch = -1, reader_warp = -1;  // last generic read (-2: several warps, or a warpgroup's wgmma)
  int pending = 0;             // cp.async issued and not yet complete
  int wgmma_readers = 0;       // wgmma ops in flight that read this byte
};
std::vector<ByteState> g_bytes(kWindow);

struct Buffer {
  const char* begin;
  size_t bytes;
};
std::vector<Buffer> g_inputs;  // q, k, v: where cp.async may read

struct Copy {
  uint32_t dst;
  const void* src;
  bool pred;
};

struct WgmmaOp;  // below

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int tid = 0;
  bool done = false, blocked = false;
  std::vector<Copy> open_group;
  std::deque<std::vector<Copy>> groups;  // cp.async groups committed, not complete
  std::vector<uint32_t> unfenced;        // 16/4-byte chunks this thread wrote since its last proxy fence
  // wgmma state
  bool fenced = false;                                     // wgmma.fence since the last wait (or start)
  std::vector<std::shared_ptr<WgmmaOp>> wg_open;           // issued, not committed
  std::deque<std::vector<std::shared_ptr<WgmmaOp>>> wg_groups;  // committed, not complete
  std::map<float*, int> acc_in_flight;                     // accumulator array -> ops in flight on it
};

struct Collective {  // one warp's or warpgroup's rendezvous
  int arrived = 0;
  long generation = 0;
  std::string op;
  std::vector<std::vector<uint32_t>> in_u;
  std::vector<std::vector<float>> in_f;
  std::vector<std::vector<float>> out_f;
  std::vector<uint64_t> in_l;
  std::shared_ptr<WgmmaOp> made;  // a wgmma collective's op, handed from the computing thread to the others
};

std::vector<Fiber> g_fibers;
std::vector<Collective> g_warps, g_warpgroups;
int g_cur = -1;
ucontext_t g_sched;
int g_barrier_arrived = 0;
long g_barrier_generation = 0;
std::mt19937 g_sched_rng(1234);
uint3 g_block_idx, g_grid_dim;

inline Fiber& cur() { return g_fibers[g_cur]; }
inline int cur_warp() { return cur().tid / 32; }
inline int cur_lane() { return cur().tid % 32; }

void yield_blocked() {
  cur().blocked = true;
  swapcontext(&cur().ctx, &g_sched);
}

void check_byte_read(uint32_t addr, const char* what) {
  ByteState& b = g_bytes[addr];
  if (b.pending) fail(std::string(what) + ": reads a cp.async destination before its wait_group + barrier");
  if (b.write_epoch == g_epoch && (b.async_write || b.writer_warp != cur_warp()))
    fail(std::string(what) + ": reads data written by cp.async or by another warp with no __syncthreads in between");
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp()) b.reader_warp = -2;
  else b.reader_warp = cur_warp();
  b.read_epoch = g_epoch;
}

void check_byte_write(uint32_t addr, const char* what) {
  ByteState& b = g_bytes[addr];
  if (b.wgmma_readers) fail(std::string(what) + ": overwrites an operand of a wgmma still in flight");
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp())
    fail(std::string(what) + ": overwrites data another warp read with no __syncthreads in between");
}

void record_write(uint32_t addr, int bytes, bool async) {
  for (int i = 0; i < bytes; ++i) {
    ByteState& s = g_bytes[addr + i];
    s.write_epoch = g_epoch;
    s.writer_warp = cur_warp();
    s.writer_tid = cur().tid;
    s.async_write = async;
    s.proxy_visible = false;
  }
  cur().unfenced.push_back(addr);
  cur().unfenced.push_back(static_cast<uint32_t>(bytes));
}

// Rendezvous of `size` threads (a warp or a warpgroup): every thread deposits its inputs; the last to
// arrive runs `compute` for all.
void collective(Collective& c, int first_tid, int size, const std::string& op,
                const std::function<void(Collective&)>& compute) {
  if (c.arrived == 0) c.op = op;
  else if (c.op != op) fail("threads of one warp(group) in different collectives (" + c.op + " vs " + op + ")");
  const long gen = c.generation;
  if (++c.arrived == size) {
    compute(c);
    c.arrived = 0;
    ++c.generation;
    for (int l = 0; l < size; ++l) g_fibers[first_tid + l].blocked = false;
  } else {
    while (c.generation == gen) yield_blocked();
  }
}

void syncthreads() {
  if (!cur().wg_open.empty()) fail("__syncthreads with uncommitted wgmma ops");
  const long gen = g_barrier_generation;
  if (++g_barrier_arrived == static_cast<int>(g_fibers.size())) {
    g_barrier_arrived = 0;
    ++g_barrier_generation;
    ++g_epoch;
    for (auto& f : g_fibers) f.blocked = false;
  } else {
    while (g_barrier_generation == gen) yield_blocked();
  }
}

float shfl_xor(float v, int offset) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  c.in_f[lane][0] = v;
  collective(c, cur_warp() * 32, 32, "shfl_xor" + std::to_string(offset), [&](Collective& cc) {
    for (int l = 0; l < 32; ++l) cc.out_f[l][0] = cc.in_f[l ^ offset][0];
  });
  return c.out_f[lane][0];
}

template <typename T>
double to_double(uint16_t bits) {
  T v;
  std::memcpy(static_cast<void*>(&v), &bits, 2);
  if constexpr (std::is_same<T, __half>::value) return __half2float(v);
  else return __bfloat162float(v);
}

// ---------------------------------------------------------------- cp.async and the proxy fence
void complete_group(std::vector<Copy>& group) {
  for (const Copy& cp : group) {
    for (int b = 0; b < 16; ++b) {
      if (g_bytes[cp.dst + b].wgmma_readers) fail("cp.async lands on an operand of a wgmma still in flight");
      --g_bytes[cp.dst + b].pending;
    }
    record_write(cp.dst, 16, true);
    unsigned char* p = host(cp.dst, 16, "cp.async");
    if (cp.pred) std::memcpy(p, cp.src, 16);
    else std::memset(p, 0, 16);
  }
}

void cp_async(uint32_t dst, const void* src, bool pred) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async: address not 16-byte aligned");
  host(dst, 16, "cp.async");
  bool in_bounds = false;
  for (const Buffer& b : g_inputs) {
    const char* p = static_cast<const char*>(src);
    if (p >= b.begin && p + 16 <= b.begin + b.bytes) in_bounds = true;
  }
  if (!in_bounds) fail(pred ? "cp.async: reads outside q/k/v" : "cp.async zero-fill: source address outside q/k/v");
  for (int b = 0; b < 16; ++b) {
    check_byte_write(dst + b, "cp.async");
    if (g_bytes[dst + b].pending) fail("cp.async: two copies in flight to the same shared bytes");
    ++g_bytes[dst + b].pending;
  }
  cur().open_group.push_back({dst, src, pred});
}

void cp_commit() {
  cur().groups.push_back(std::move(cur().open_group));
  cur().open_group.clear();
}

void cp_wait(int n) {
  if (!cur().open_group.empty()) fail("cp.async.wait_group with uncommitted copies (they would not be waited for)");
  while (static_cast<int>(cur().groups.size()) > n) {
    complete_group(cur().groups.front());
    cur().groups.pop_front();
  }
}

// fence.proxy.async.shared::cta: this thread's completed generic-proxy writes become visible to the
// async proxy (in-flight cp.async copies are not completed writes: they stay invisible).
void proxy_fence() {
  auto& u = cur().unfenced;
  for (size_t i = 0; i < u.size(); i += 2) {
    for (uint32_t b = 0; b < u[i + 1]; ++b) {
      ByteState& s = g_bytes[u[i] + b];
      if (s.writer_tid == cur().tid) s.proxy_visible = true;
    }
  }
  u.clear();
}

void st_shared(uint32_t addr, const void* v, int bytes) {
  if (addr % bytes != 0) fail("st.shared misaligned");
  unsigned char* p = host(addr, bytes, "st.shared");
  for (int b = 0; b < bytes; ++b) {
    check_byte_write(addr + b, "st.shared");
    ByteState& s = g_bytes[addr + b];
    if (s.pending) fail("st.shared: overwrites a cp.async destination in flight");
    if (s.async_write && s.write_epoch == g_epoch && s.writer_tid != cur().tid)
      fail("st.shared: overwrites another thread's cp.async data with no __syncthreads in between");
  }
  record_write(addr, bytes, false);
  std::memcpy(p, v, bytes);
}

void ld_shared(uint32_t addr, void* v, int bytes) {
  if (addr % bytes != 0) fail("ld.shared misaligned");
  const unsigned char* p = host(addr, bytes, "ld.shared");
  for (int b = 0; b < bytes; ++b) check_byte_read(addr + b, "ld.shared");
  std::memcpy(v, p, bytes);
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
  int n = 0;
  std::vector<std::vector<float>> result;       // per thread of the warpgroup
  std::vector<std::pair<uint32_t, uint8_t>> snapshot;  // shared bytes read, with their values at issue
  std::vector<std::vector<uint32_t>> a_regs;    // per thread (register A)
  std::vector<float*> acc_ptr;                  // per thread
  std::vector<const uint32_t*> a_ptr;           // per thread (register A), or null
  int completed = 0;
};

uint32_t g_poison_bits = 0x7fc0dead;  // the NaN an accumulator holds while its wgmma is in flight

void wgmma_fence() { cur().fenced = true; }

// One wgmma.mma_async: acc is this thread's accumulator (n / 2 floats), a_regs its A fragment (null:
// A from desc_a), tnsp_b: B is MN-major. T: __half or __nv_bfloat16.
template <typename T>
void wgmma(int n, float* acc, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, int scale_d, int tnsp_b) {
  Fiber& me = cur();
  const int wg = me.tid / 128, wl = me.tid % 128;
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
                           (tnsp_b ? ".tnspB" : "") + (std::is_same<T, __half>::value ? ".f16" : ".bf16");
  collective(c, wg * 128, 128, name, [&](Collective& cc) {
    auto o = std::make_shared<WgmmaOp>();
    o->n = n;
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
        if (s.pending) fail("wgmma reads a cp.async destination still in flight");
        if (s.write_epoch < 0) fail("wgmma reads shared memory never written");
        if (s.write_epoch == g_epoch) fail("wgmma reads data written with no __syncthreads in between");
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
      const Desc da = decode(cc.in_l[0]);  // A from shared memory: K-major (imm-trans-a = 0)
      for (int m = 0; m < 64; ++m)
        for (int k = 0; k < 16; ++k) A[m * 16 + k] = to_double<T>(read16(element_addr(da, true, m, k)));
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
    cc.made = o;
  });
  std::shared_ptr<WgmmaOp> op = c.made;
  op->acc_ptr[wl] = acc;
  op->a_ptr[wl] = a_regs;
  if (a_regs) op->a_regs[wl].assign(a_regs, a_regs + 4);
  for (int i = 0; i < regs; ++i) std::memcpy(&acc[i], &g_poison_bits, 4);
  ++me.acc_in_flight[acc];
  me.wg_open.push_back(op);
}

void wgmma_commit() {
  cur().wg_groups.push_back(std::move(cur().wg_open));
  cur().wg_open.clear();
}

void wgmma_wait(int n) {
  Fiber& me = cur();
  const int wl = me.tid % 128;
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
          s.reader_warp = -2;
        }
        op->snapshot.clear();
      }
    }
    me.wg_groups.pop_front();
  }
  me.fenced = false;
}

// ---------------------------------------------------------------- fibers and the block
std::function<void()> g_body;
std::string g_error;
void fiber_main(int idx) {
  g_cur = idx;
  try {
    g_body();
  } catch (const std::exception& e) {
    if (g_error.empty()) g_error = e.what();
  }
  cur().done = true;
  swapcontext(&cur().ctx, &g_sched);
}

void run_block(int threads, const std::function<void()>& body) {
  g_body = body;
  g_fibers.assign(threads, Fiber{});
  auto make = [](int size) {
    Collective c;
    c.in_u.assign(size, std::vector<uint32_t>(5));
    c.in_f.assign(size, std::vector<float>(1));
    c.out_f.assign(size, std::vector<float>(1));
    c.in_l.assign(2 * size, 0);
    return c;
  };
  g_warps.assign(threads / 32, make(32));
  g_warpgroups.assign(threads / 128, make(128));
  g_barrier_arrived = 0;
  g_epoch = 0;
  g_error.clear();
  std::memset(g_dyn, 0xff, kMaxSmem);  // NaN in fp16 and bf16: unwritten shared memory shows
  std::fill(g_bytes.begin(), g_bytes.end(), ByteState{});
  for (int i = 0; i < threads; ++i) {
    Fiber& f = g_fibers[i];
    f.tid = i;
    f.stack.resize(1 << 18);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, reinterpret_cast<void (*)()>(fiber_main), 1, i);
  }
  std::vector<int> order(threads);
  for (;;) {
    order.clear();
    bool all_done = true;
    for (auto& f : g_fibers) {
      if (!f.done) all_done = false;
      if (!f.done && !f.blocked) order.push_back(f.tid);
    }
    if (all_done) break;
    if (order.empty()) fail("deadlock: every live thread waits (a barrier or collective not reached by all)");
    std::shuffle(order.begin(), order.end(), g_sched_rng);
    for (int idx : order) {
      if (g_fibers[idx].done || g_fibers[idx].blocked) continue;
      g_cur = idx;
      swapcontext(&g_sched, &g_fibers[idx].ctx);
      if (!g_error.empty()) fail(g_error);
    }
  }
  for (auto& f : g_fibers) {
    if (!f.groups.empty() || !f.open_group.empty()) fail("thread exited with cp.async copies in flight");
    if (!f.wg_groups.empty() || !f.wg_open.empty()) fail("thread exited with wgmma ops in flight");
  }
  if (g_barrier_arrived != 0) fail("thread exited while others wait at a barrier");
}

inline const uint3& thread_idx() {
  static thread_local uint3 v;
  v = {static_cast<unsigned>(cur().tid), 0, 0};
  return v;
}

}  // namespace emu

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::g_block_idx)
#define gridDim (::emu::g_grid_dim)
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(mask, v, offset) ::emu::shfl_xor((v), (offset))

// The kernel's PTX wrappers (csrc/attention/sm90/wgmma.cuh, not compiled under TILED_ATTN_EMULATION).
namespace tiled_attn {
namespace flash_fwd_sm90 {
inline uint32_t smem_u32(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < emu::g_dyn || c >= emu::g_dyn + emu::kMaxSmem) emu::fail("smem_u32 of a non-shared pointer");
  return emu::g_base + static_cast<uint32_t>(c - emu::g_dyn);
}
inline void cp_async_16(uint32_t dst, const void* src, bool pred) { emu::cp_async(dst, src, pred); }
inline void cp_async_16_full(uint32_t dst, const void* src) { emu::cp_async(dst, src, true); }
inline void cp_async_commit() { emu::cp_commit(); }
template <int N>
inline void cp_async_wait() {
  emu::cp_wait(N);
}
inline void fence_proxy_async() { emu::proxy_fence(); }
inline void st_shared_b32(uint32_t addr, uint32_t v) { emu::st_shared(addr, &v, 4); }
inline uint4 ld_shared_b128(uint32_t addr) {
  uint4 v;
  emu::ld_shared(addr, &v, 16);
  return v;
}
inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  emu::wgmma_wait(N);
}
template <int N>
inline void fence_operands(float (&)[N]) {}
template <int N>
inline void fence_operands(uint32_t (&)[N][4]) {}
template <int N, typename T>
struct Wgmma {
  template <int kTnspB>
  static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    emu::wgmma<T>(N, d, nullptr, desc_a, desc_b, scale_d, kTnspB);
  }
  template <int kTnspB>
  static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    emu::wgmma<T>(N, d, a, 0, desc_b, scale_d, kTnspB);
  }
};
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

#include "attention/sm90/flash_fwd_sm90_launch.cuh"

namespace tiled_attn {
namespace flash_fwd_sm90 {
template <class Tr, typename T>
cudaError_t launch_kernel(Params params, int batch_heads, cudaStream_t) {
  if (Tr::kSmemBytes > emu::kMaxSmem) return cudaErrorInvalidValue;
  emu::g_smem_bytes = Tr::kSmemBytes;
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM);
  for (int64_t first = 0; first < batch_heads; first += kMaxGridY) {
    params.bh_offset = static_cast<int>(first);
    const unsigned gy = static_cast<unsigned>(std::min<int64_t>(kMaxGridY, batch_heads - first));
    emu::g_grid_dim = {m_blocks, gy, 1};
    for (unsigned by = 0; by < gy; ++by) {
      for (unsigned bx = 0; bx < m_blocks; ++bx) {
        emu::g_block_idx = {bx, by, 0};
        emu::run_block(Tr::kThreads, [&] { flash_fwd_sm90_kernel<Tr, T>(params); });
      }
    }
  }
  return cudaSuccess;
}
}  // namespace flash_fwd_sm90
}  // namespace tiled_attn

#include "attention/sm90/flash_fwd_sm90.cu"

// ------------------------------------------------------------------------------------------------
// Self-test of the descriptor decoding: element_addr against the layouts written out by hand for one
// small case of each kind (so a wrong table fails here, not as a mystery in the attention cases).
// ------------------------------------------------------------------------------------------------
namespace {
void check_layout_tables() {
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
}  // namespace

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
namespace {

template <typename T>
uint16_t to_bits(double x) {
  T v;
  if constexpr (std::is_same<T, __half>::value) v = __float2half_rn(static_cast<float>(x));
  else v = __float2bfloat16_rn(static_cast<float>(x));
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

struct Case {
  int b, hq, hkv, nq, nk, d;
  bool causal;
  int64_t offset;  // causal offset
  bool bf16;
  double scale = 0;  // 0: 1/sqrt(d)
};

// q, k, v laid out (B, N, H, D) with the seq stride padded (a non-contiguous view); out (B, Nq, Hq, D)
// with a padded head stride, lse (B, Hq, Nq); guard elements around everything.
template <typename T>
bool run_case(const Case& c, std::mt19937& rng) {
  const int pad = 8, guard = 64;
  const int64_t q_seq = int64_t{c.hq} * c.d + pad, k_seq = int64_t{c.hkv} * c.d + pad;
  const int64_t q_batch = int64_t{c.nq} * q_seq, k_batch = int64_t{c.nk} * k_seq;
  const int64_t o_head = c.d + 8, o_seq = int64_t{c.hq} * o_head, o_batch = int64_t{c.nq} * o_seq;
  const size_t q_elems = static_cast<size_t>(c.b) * q_batch, k_elems = static_cast<size_t>(c.b) * k_batch;
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<uint16_t>& buf, size_t n) {
    buf.assign(n + 2 * guard, 0);
    for (size_t i = 0; i < n; ++i) buf[guard + i] = to_bits<T>(normal(rng));
  };
  std::vector<uint16_t> q, k, v;
  fill(q, q_elems);
  fill(k, k_elems);
  fill(v, k_elems);
  const uint16_t kPoison = 0x7e00 | 0x7fc0;  // a NaN in both fp16 and bf16
  std::vector<uint16_t> out(static_cast<size_t>(c.b) * o_batch + 2 * guard, kPoison);
  std::vector<float> lse(static_cast<size_t>(c.b) * c.hq * c.nq + 2 * guard, std::nanf(""));
  // The dynamic shared memory's address this case: 16-byte aligned, not 1024-aligned (but 0 sometimes).
  emu::g_base = static_cast<uint32_t>(std::uniform_int_distribution<int>(0, 63)(rng)) * 16;

  const uint16_t* qp = q.data() + guard;
  const uint16_t* kp = k.data() + guard;
  const uint16_t* vp = v.data() + guard;
  emu::g_inputs = {{reinterpret_cast<const char*>(qp), q_elems * 2},
                   {reinterpret_cast<const char*>(kp), k_elems * 2},
                   {reinterpret_cast<const char*>(vp), k_elems * 2}};
  const double scale = static_cast<float>(c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d)));
  const tiled_attn::AttnStrides qs{q_batch, c.d, q_seq}, ks{k_batch, c.d, k_seq}, os{o_batch, o_head, o_seq};
  const cudaError_t err = tiled_attn::attention_fwd_sm90(
      c.bf16 ? tiled_attn::AttnDtype::kBFloat16 : tiled_attn::AttnDtype::kFloat16, qp, kp, vp, out.data() + guard,
      lse.data() + guard, c.b, c.hq, c.hkv, c.nq, c.nk, c.d, qs, ks, ks, os, static_cast<float>(scale), c.causal,
      c.offset, nullptr);
  if (err != cudaSuccess) emu::fail("attention_fwd_sm90 returned " + std::to_string(static_cast<int>(err)));

  const int group = c.hq / c.hkv;
  double max_err = 0, max_lse_err = 0;
  std::vector<double> srow(c.nk);
  for (int b = 0; b < c.b; ++b) {
    for (int h = 0; h < c.hq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < c.nq; ++i) {
        double m = -INFINITY;
        for (int j = 0; j < c.nk; ++j) {
          const bool visible = !c.causal || j <= i + c.offset;
          double s = -INFINITY;
          if (visible) {
            s = 0;
            for (int e = 0; e < c.d; ++e) {
              s += emu::to_double<T>(qp[b * q_batch + i * q_seq + h * c.d + e]) *
                   emu::to_double<T>(kp[b * k_batch + j * k_seq + hk * c.d + e]);
            }
            s *= scale;
          }
          srow[j] = s;
          m = std::max(m, s);
        }
        double l = 0;
        for (int j = 0; j < c.nk; ++j) l += m == -INFINITY ? 0.0 : std::exp(srow[j] - m);
        const double ref_lse = l == 0 ? -INFINITY : m + std::log(l);
        const float got_lse = lse[guard + (static_cast<size_t>(b) * c.hq + h) * c.nq + i];
        if (ref_lse == -INFINITY) {
          if (!(got_lse == -INFINITY)) emu::fail("lse of a row with no visible key is not -inf");
        } else {
          const double e = std::fabs(got_lse - ref_lse);
          if (!(e <= 1e30)) emu::fail("lse not finite where the reference is (row " + std::to_string(i) + ")");
          max_lse_err = std::max(max_lse_err, e);
        }
        for (int e = 0; e < c.d; ++e) {
          double o = 0;
          if (l > 0) {
            for (int j = 0; j < c.nk; ++j) {
              if (srow[j] == -INFINITY) continue;
              o += std::exp(srow[j] - m) / l * emu::to_double<T>(vp[b * k_batch + j * k_seq + hk * c.d + e]);
            }
          }
          const double got = emu::to_double<T>(out[guard + b * o_batch + i * o_seq + h * o_head + e]);
          const double err = std::fabs(got - o);
          if (!(err <= 1e30)) {
            emu::fail("output element not finite (unwritten, or an accumulator read before its wgmma's wait) at b=" +
                      std::to_string(b) + " h=" + std::to_string(h) + " i=" + std::to_string(i) +
                      " e=" + std::to_string(e));
          }
          max_err = std::max(max_err, err);
        }
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const bool inside = i >= static_cast<size_t>(guard) && i < out.size() - guard &&
                        ((i - guard) % o_head) < static_cast<size_t>(c.d);
    if (!inside && out[i] != kPoison) emu::fail("write outside out's elements at index " + std::to_string(i));
  }
  for (int i = 0; i < guard; ++i) {
    if (!std::isnan(lse[i]) || !std::isnan(lse[lse.size() - 1 - i])) emu::fail("write outside lse");
  }
  // The same tolerance as flash_fwd_emulator.cpp: fp16/bf16 rounding of P and of the output.
  const double tol = c.bf16 ? 2e-2 : 3e-3;
  const bool ok = max_err <= tol && max_lse_err <= 1e-3;
  std::printf("%s D=%3d %s B=%d Hq=%d Hkv=%d Nq=%4d Nk=%4d causal=%d offset=%5lld scale=%+.3f smem_base=%4u  "
              "max|out-ref|=%.2e  max|lse-ref|=%.2e\n",
              ok ? "ok  " : "FAIL", c.d, c.bf16 ? "bf16" : "fp16", c.b, c.hq, c.hkv, c.nq, c.nk, c.causal,
              static_cast<long long>(c.offset), scale, emu::g_base, max_err, max_lse_err);
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int only_d = argc > 1 ? std::atoi(argv[1]) : 0;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : 20261122u;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  emu::g_sched_rng.seed(seed);
  int failed = 0, ran = 0;
  try {
    check_layout_tables();
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  std::vector<Case> cases;
  for (int d : {64, 128, 256}) {
    if (only_d && d != only_d) continue;
    const bool bf = d == 128;  // alternate the dtype across head dims and cases
    cases.push_back({1, 1, 1, 128, 128, d, false, 0, !bf});          // one full tile each way
    cases.push_back({1, 1, 1, 1, 1, d, false, 0, bf});                // one query, one key
    cases.push_back({1, 2, 1, 3, 799, d, false, 0, !bf});             // many key tiles, ragged, GQA 2
    cases.push_back({1, 2, 1, 113, 203, d, true, 203 - 113, bf});     // bottom-right causal, GQA 2
    cases.push_back({2, 2, 2, 128, 217, d, false, 0, bf});            // ragged keys, two batches
    cases.push_back({1, 2, 1, 128, 217, d, true, 217 - 128, !bf});
    cases.push_back({1, 1, 1, 200, 256, d, true, 256 - 200, bf});     // two query tiles, diagonal inside
    cases.push_back({1, 2, 2, 200, 256, d, false, 0, !bf});
    cases.push_back({1, 2, 1, 150, 70, d, true, 70 - 150, !bf});      // Nq > Nk: rows with no key
    cases.push_back({1, 1, 1, 64, 128, d, false, 0, bf, -0.3});       // negative scale
    cases.push_back({1, 2, 1, 5, 0, d, false, 0, !bf});               // no keys at all
    if (d != 256) cases.push_back({1, 3, 1, 200, 200, d, true, 0, bf});  // top-left causal, MQA
  }
  for (const Case& c : cases) {
    ++ran;
    try {
      const bool ok = c.bf16 ? run_case<__nv_bfloat16>(c, rng) : run_case<__half>(c, rng);
      if (!ok) ++failed;
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL D=%3d %s Nq=%d Nk=%d causal=%d: %s\n", c.d, c.bf16 ? "bf16" : "fp16", c.nq, c.nk, c.causal,
                  e.what());
      std::fflush(stdout);
    }
  }
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
