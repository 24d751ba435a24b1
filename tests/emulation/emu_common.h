// emu_common.h: what the two attention-kernel emulators share (flash_fwd_emulator.cpp: the mma.sync
// kernel, csrc/attention/flash_fwd_kernel.cuh; flash_fwd_sm90_emulator.cpp: the wgmma kernel,
// csrc/attention/sm90/). Included once, ahead of the kernel headers, by each of them; it provides
//   - host stand-ins for the device built-ins the kernels and online_softmax.cuh use;
//   - the kernel's `extern __shared__ smem_raw[]`, in the namespace EMU_KERNEL_NAMESPACE names
//     (tiled_attn::EMU_KERNEL_NAMESPACE: define it before including), mapped to shared addresses
//     [g_base, g_base + g_smem_bytes);
//   - each CUDA thread a ucontext fiber, scheduled in a random order among the runnable ones; warp
//     (or warpgroup) collectives that wait for all their threads, then compute every thread's result
//     at once; __syncthreads; shfl.xor;
//   - per shared-memory byte hazard bookkeeping: a read of a cp.async destination before its
//     wait_group + barrier, a read of data another warp wrote (or cp.async wrote) or a write over data
//     another warp read with no __syncthreads in between; cp.async (16 bytes, src-size zero fill) /
//     commit_group / wait_group, st.shared / ld.shared, fence.proxy.async (the generic-proxy writes
//     each thread has fenced: only the wgmma emulator reads through the async proxy);
//   - the kernel-namespace wrappers both kernels share (smem_u32, cp_async_*), the grid launch loop;
//   - the cases: the float64 reference on the same rounded inputs and the output / lse / guard checks.
// What is kernel-specific stays out of it: ldmatrix and mma.sync in flash_fwd_emulator.cpp; wgmma, its
// descriptors and in-flight operand checks, mbarriers and TMA in sm90_emu.h (shared by the sm90 forward
// and backward emulators). Those define the hooks declared below (on_barrier, on_block_start,
// on_block_exit, ...) and any wrapper whose signature differs between the kernels.
#pragma once

#ifndef EMU_KERNEL_NAMESPACE
#error "define EMU_KERNEL_NAMESPACE (the kernel's namespace inside tiled_attn) before including emu_common.h"
#endif

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
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/attention.h"

// ------------------------------------------------------------------------------------------------
// Device built-ins the kernels and online_softmax.cuh use, on the host.
// ------------------------------------------------------------------------------------------------
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
// Round-to-nearest float arithmetic (CompensatedState in online_softmax.cuh; the emulators build with
// -std=c++17, which keeps g++ from contracting these into FMAs).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {
constexpr int kMaxSmem = 232448;          // the sm90 per-block opt-in limit (227 KB)
constexpr int kWindow = kMaxSmem + 1024;  // shared addresses: [base, base + bytes) with base < 1024
}  // namespace emu

// The kernel's `extern __shared__ unsigned char smem_raw[]` (a block-scope extern in its namespace).
namespace tiled_attn {
namespace EMU_KERNEL_NAMESPACE {
alignas(16) unsigned char smem_raw[emu::kMaxSmem];
}  // namespace EMU_KERNEL_NAMESPACE
}  // namespace tiled_attn

namespace emu {

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error(what); }

unsigned char* const g_dyn = tiled_attn::EMU_KERNEL_NAMESPACE::smem_raw;
uint32_t g_base = 0;   // shared-space address of smem_raw[0] this launch (16-byte aligned, < 1024)
int g_smem_bytes = 0;  // this launch's dynamic shared memory
int g_epoch = 0;       // __syncthreads completed in this block
// Barrier phases completed, counting those a bar.arrive took part in (sm90_emu.h): what orders a
// generic write before the async proxy's read of it (a bulk reduce-add after the writer's proxy fence).
int g_release_epoch = 0;

// Host pointer of a shared address (checked against the allocation).
inline unsigned char* host(uint32_t addr, int bytes, const char* what) {
  if (addr < g_base || addr + bytes > g_base + static_cast<uint32_t>(g_smem_bytes))
    fail(std::string(what) + ": shared address " + std::to_string(addr) + " outside the dynamic allocation");
  return g_dyn + (addr - g_base);
}

// Shared address of a host pointer into smem_raw.
inline uint32_t smem_addr(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < g_dyn || c >= g_dyn + kMaxSmem) fail("smem_u32 of a non-shared pointer");
  return g_base + static_cast<uint32_t>(c - g_dyn);
}

// Per shared-memory byte: hazard bookkeeping.
struct ByteState {
  int write_epoch = -1, writer_warp = -1, writer_tid = -1;  // last completed write
  int write_release = -1;      // g_release_epoch at that write
  bool async_write = false;    // by cp.async: visible to any thread only after a barrier
  bool proxy_visible = false;  // the writer ran fence.proxy.async after the write (wgmma may read it)
  int read_epoch = -1, reader_warp = -1;  // last generic read (-2: several warps, or a warpgroup's wgmma)
  int pending = 0;             // cp.async (or TMA) issued and not yet complete
  int wgmma_readers = 0;       // wgmma ops in flight that read this byte (the sm90 emulator's)
  int bulk_readers = 0;        // bulk reduce-adds that have not read this byte yet (sm90: wait_group.read)
  // Written by a TMA (the sm90 emulator's): the mbarrier its bytes complete on and the phase count
  // that barrier reaches when that phase completes; a reader must have waited for it (on_tma_byte).
  int tma_bar = -1;
  long tma_seq = 0;
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

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int tid = 0;
  bool done = false, blocked = false;
  std::vector<Copy> open_group;
  std::deque<std::vector<Copy>> groups;  // cp.async groups committed, not complete
  std::vector<uint32_t> unfenced;        // (address, bytes) pairs this thread wrote since its last proxy fence
};

struct Collective {  // one warp's or warpgroup's rendezvous
  int arrived = 0;
  long generation = 0;
  std::string op;
  std::vector<std::vector<uint32_t>> in_u, out_u;  // per thread: 8 words in, 4 out
  std::vector<std::vector<float>> in_f, out_f;     // per thread: 4 floats each
  std::vector<uint64_t> in_l;                      // 2 per thread
  static Collective make(int size) {
    Collective c;
    c.in_u.assign(size, std::vector<uint32_t>(8));
    c.out_u.assign(size, std::vector<uint32_t>(4));
    c.in_f.assign(size, std::vector<float>(4));
    c.out_f.assign(size, std::vector<float>(4));
    c.in_l.assign(2 * size, 0);
    return c;
  }
};

std::vector<Fiber> g_fibers;
std::vector<Collective> g_warps;
int g_cur = -1;
ucontext_t g_sched;
int g_barrier_arrived = 0;
long g_barrier_generation = 0;
std::mt19937 g_sched_rng(1234);
uint3 g_block_idx, g_grid_dim;
// A lagging thread range [g_lag_lo, g_lag_hi) (none while empty): its fibers run only when no other
// fiber can (after asynchronous work on_stall completes first) or one round in kLagEvery, so the
// others run as far ahead of it as the kernel's synchronization allows. A random schedule keeps
// warpgroups nearly in step, and then a barrier that counts too few arrivals (a slot released when
// two of three consumer warpgroups are done with it) is never caught: the third is never behind.
int g_lag_lo = 0, g_lag_hi = 0;
constexpr long kLagEvery = 64;

inline Fiber& cur() { return g_fibers[g_cur]; }
inline int cur_warp() { return cur().tid / 32; }
inline int cur_lane() { return cur().tid % 32; }

// Hooks each emulator defines: before a thread arrives at __syncthreads; when a block's fibers are set
// up (the warps already are); after every thread exited (the cp.async check already passed); each
// scheduling round; when no thread can run (true: it completed some asynchronous work, so a thread may
// run again; false: a deadlock); a generic access (st/ld.shared) of a byte a TMA wrote.
void on_barrier();
void on_block_start(int threads);
void on_block_exit();
void on_round();
bool on_stall();
void on_tma_byte(const struct ByteState& b, const char* what);

inline void yield_blocked() {
  cur().blocked = true;
  swapcontext(&cur().ctx, &g_sched);
}
// A scheduling point: other threads (and, in the sm90 emulator, TMA completions) may run before this
// thread's next instruction.
inline void yield_now() { swapcontext(&cur().ctx, &g_sched); }

inline void check_byte_read(uint32_t addr, const char* what) {
  host(addr, 1, what);
  ByteState& b = g_bytes[addr];
  if (b.pending) fail(std::string(what) + ": reads a cp.async destination before its wait_group + barrier");
  if (b.tma_bar >= 0) on_tma_byte(b, what);
  else if (b.write_epoch == g_epoch && (b.async_write || b.writer_warp != cur_warp()))
    fail(std::string(what) + ": reads data written by cp.async or by another warp with no __syncthreads in between");
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp()) b.reader_warp = -2;
  else b.reader_warp = cur_warp();
  b.read_epoch = g_epoch;
}

inline void check_byte_write(uint32_t addr, const char* what) {
  host(addr, 1, what);
  ByteState& b = g_bytes[addr];
  if (b.wgmma_readers) fail(std::string(what) + ": overwrites an operand of a wgmma still in flight");
  if (b.bulk_readers)
    fail(std::string(what) + ": overwrites the source of a bulk reduce-add before its wait_group.read");
  if (b.tma_bar >= 0) on_tma_byte(b, what);
  // reader_warp -(10 + w): last read by warpgroup w's wgmmas, all complete (wgmma_readers is 0): that
  // warpgroup's own threads may overwrite it (their wait_group ordered the read before).
  const bool own_wgmma = b.reader_warp <= -10 && b.reader_warp == -(10 + cur_warp() / 4);
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp() && !own_wgmma)
    fail(std::string(what) + ": overwrites data another warp read with no __syncthreads in between");
}

// A completed write by the current thread (generic proxy: not yet visible to the async proxy).
inline void record_write(uint32_t addr, int bytes, bool async) {
  for (int i = 0; i < bytes; ++i) {
    ByteState& s = g_bytes[addr + i];
    s.write_epoch = g_epoch;
    s.write_release = g_release_epoch;
    s.writer_warp = cur_warp();
    s.writer_tid = cur().tid;
    s.async_write = async;
    s.proxy_visible = false;
    s.tma_bar = -1;
  }
  cur().unfenced.push_back(addr);
  cur().unfenced.push_back(static_cast<uint32_t>(bytes));
}

// Rendezvous of `size` threads from first_tid (a warp or a warpgroup): every thread deposits its
// inputs in c; the last to arrive runs `compute(c)` for all.
template <class Compute>
void collective(Collective& c, int first_tid, int size, const std::string& op, const Compute& compute) {
  if (c.arrived == 0) c.op = op;
  else if (c.op != op) fail("threads of one warp(group) in different collectives (" + c.op + " vs " + op + "): divergence");
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

// A collective of the current thread's warp.
template <class Compute>
void warp_collective(const std::string& op, const Compute& compute) {
  collective(g_warps[cur_warp()], cur_warp() * 32, 32, op, compute);
}

inline void syncthreads() {
  on_barrier();
  const long gen = g_barrier_generation;
  if (++g_barrier_arrived == static_cast<int>(g_fibers.size())) {
    g_barrier_arrived = 0;
    ++g_barrier_generation;
    ++g_epoch;
    ++g_release_epoch;
    for (auto& f : g_fibers) f.blocked = false;
  } else {
    while (g_barrier_generation == gen) yield_blocked();
  }
}

inline void syncwarp() {
  warp_collective("syncwarp", [](Collective&) {});
}

inline float shfl_xor(float v, int offset) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  c.in_f[lane][0] = v;
  warp_collective("shfl_xor" + std::to_string(offset), [&](Collective& cc) {
    for (int l = 0; l < 32; ++l) cc.out_f[l][0] = cc.in_f[l ^ offset][0];
  });
  return c.out_f[lane][0];
}

// The 32-bit integer form (the persistent forward's epilogue trades packed bf16 / fp16 pairs): the bits
// travel through the float form unchanged (copies, no arithmetic). A template for uint32_t alone, so
// that other arguments (a double) still convert to the float form as they did.
template <typename U, std::enable_if_t<std::is_same<U, uint32_t>::value, int> = 0>
inline uint32_t shfl_xor(U v, int offset) {
  float f;
  std::memcpy(&f, &v, 4);
  f = shfl_xor(f, offset);
  std::memcpy(&v, &f, 4);
  return v;
}

template <typename T>
double to_double(uint16_t bits) {
  T v;
  std::memcpy(static_cast<void*>(&v), &bits, 2);
  if constexpr (std::is_same<T, __half>::value) return __half2float(v);
  else return __bfloat162float(v);
}

// ---------------------------------------------------------------- cp.async, st/ld.shared, the proxy fence
inline void complete_group(std::vector<Copy>& group) {
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

inline void cp_async(uint32_t dst, const void* src, bool pred) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async: address not 16-byte aligned");
  host(dst, 16, "cp.async");
  bool in_bounds = false;
  for (const Buffer& b : g_inputs) {
    const char* p = static_cast<const char*>(src);
    if (p >= b.begin && p + 16 <= b.begin + b.bytes) in_bounds = true;
  }
  // Even a zero-fill (src-size 0) gets an in-bounds address: the kernels clamp it to row 0.
  if (!in_bounds) fail(pred ? "cp.async: reads outside q/k/v" : "cp.async zero-fill: source address outside q/k/v");
  for (int b = 0; b < 16; ++b) {
    check_byte_write(dst + b, "cp.async");
    if (g_bytes[dst + b].pending) fail("cp.async: two copies in flight to the same shared bytes");
    ++g_bytes[dst + b].pending;
  }
  cur().open_group.push_back({dst, src, pred});
}

inline void cp_commit() {
  cur().groups.push_back(std::move(cur().open_group));
  cur().open_group.clear();
}

inline void cp_wait(int n) {
  if (!cur().open_group.empty()) fail("cp.async.wait_group with uncommitted copies (they would not be waited for)");
  while (static_cast<int>(cur().groups.size()) > n) {
    complete_group(cur().groups.front());
    cur().groups.pop_front();
  }
}

// fence.proxy.async.shared::cta: this thread's completed generic-proxy writes become visible to the
// async proxy (in-flight cp.async copies are not completed writes: they stay invisible).
inline void proxy_fence() {
  auto& u = cur().unfenced;
  for (size_t i = 0; i < u.size(); i += 2) {
    for (uint32_t b = 0; b < u[i + 1]; ++b) {
      ByteState& s = g_bytes[u[i] + b];
      if (s.writer_tid == cur().tid) s.proxy_visible = true;
    }
  }
  u.clear();
}

inline void st_shared(uint32_t addr, const void* v, int bytes) {
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

inline void ld_shared(uint32_t addr, void* v, int bytes) {
  if (addr % bytes != 0) fail("ld.shared misaligned");
  const unsigned char* p = host(addr, bytes, "ld.shared");
  for (int b = 0; b < bytes; ++b) check_byte_read(addr + b, "ld.shared");
  std::memcpy(v, p, bytes);
}

// ---------------------------------------------------------------- fibers and the block
std::function<void()> g_body;
std::string g_error;  // the first failure inside a fiber; the scheduler rethrows it
inline void fiber_main(int idx) {
  g_cur = idx;
  try {
    g_body();
  } catch (const std::exception& e) {
    if (g_error.empty()) g_error = e.what();
  }
  cur().done = true;
  swapcontext(&cur().ctx, &g_sched);
}

// One CTA: all threads as fibers, scheduled in a random order among the runnable ones.
inline void run_block(int threads, const std::function<void()>& body) {
  g_body = body;
  g_fibers.assign(threads, Fiber{});
  g_warps.assign(threads / 32, Collective::make(32));
  on_block_start(threads);
  g_barrier_arrived = 0;
  g_epoch = 0;
  g_release_epoch = 0;
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
  long lag_round = 0;
  for (;;) {
    order.clear();
    bool all_done = true;
    for (auto& f : g_fibers) {
      if (!f.done) all_done = false;
      if (!f.done && !f.blocked) order.push_back(f.tid);
    }
    if (all_done) break;
    if (order.empty()) {
      if (on_stall()) continue;
      fail("deadlock: every live thread waits (a barrier, collective or mbarrier phase not reached)");
    }
    if (g_lag_lo < g_lag_hi && ++lag_round % kLagEvery != 0) {
      const auto lagging = [](int t) { return t >= g_lag_lo && t < g_lag_hi; };
      if (std::all_of(order.begin(), order.end(), lagging)) {
        if (on_stall()) continue;  // let the others' asynchronous work land before the laggard runs
      } else {
        order.erase(std::remove_if(order.begin(), order.end(), lagging), order.end());
      }
    }
    on_round();
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
  }
  on_block_exit();
  if (g_barrier_arrived != 0) fail("thread exited while others wait at a barrier");
}

// The kernels' launch (<<<>>> on the GPU): grid (m_blocks, slices of at most max_grid_y of `slots`,
// gz), params.bh_offset the slice's first slot, every CTA run in turn; `kernel(params)` runs one thread.
template <class Tr, class Params, class Kernel>
cudaError_t launch_grid(Params params, int64_t slots, int64_t max_grid_y, unsigned m_blocks, unsigned gz,
                        const Kernel& kernel) {
  if (Tr::kSmemBytes > kMaxSmem) return cudaErrorInvalidValue;
  g_smem_bytes = Tr::kSmemBytes;
  for (int64_t first = 0; first < slots; first += max_grid_y) {
    params.bh_offset = static_cast<int>(first);
    const unsigned gy = static_cast<unsigned>(std::min<int64_t>(max_grid_y, slots - first));
    g_grid_dim = {m_blocks, gy, gz};
    for (unsigned bz = 0; bz < gz; ++bz) {
      for (unsigned by = 0; by < gy; ++by) {
        for (unsigned bx = 0; bx < m_blocks; ++bx) {
          g_block_idx = {bx, by, bz};
          run_block(Tr::kThreads, [&] { kernel(params); });
        }
      }
    }
  }
  return cudaSuccess;
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
#define __syncwarp() ::emu::syncwarp()
#define __shfl_xor_sync(mask, v, offset) ::emu::shfl_xor((v), (offset))

// The PTX wrappers both kernels have, with the same signatures (not compiled under TILED_ATTN_EMULATION).
namespace tiled_attn {
namespace EMU_KERNEL_NAMESPACE {
inline uint32_t smem_u32(const void* p) { return emu::smem_addr(p); }
inline void cp_async_16(uint32_t dst, const void* src, bool pred) { emu::cp_async(dst, src, pred); }
inline void cp_async_16_full(uint32_t dst, const void* src) { emu::cp_async(dst, src, true); }
inline void cp_async_commit() { emu::cp_commit(); }
template <int N>
inline void cp_async_wait() {
  emu::cp_wait(N);
}
}  // namespace EMU_KERNEL_NAMESPACE
}  // namespace tiled_attn

// ------------------------------------------------------------------------------------------------
// Cases: inputs, the launch, the float64 reference and the checks.
// ------------------------------------------------------------------------------------------------
namespace emu_cases {

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
  double scale = 0;  // 0: 1/sqrt(d); kZeroScale: a softmax scale of exactly 0
  int splits = 0;    // flash_fwd_emulator.cpp: 0: attention_fwd; >= 1: attention_fwd_split with that many key splits
};
constexpr double kZeroScale = -0.0;  // a sentinel distinct from the default (checked with signbit)

// Runs the case's kernel: q, k, v, out, lse at their first elements, the strides, the softmax scale.
using Launch = std::function<cudaError_t(tiled_attn::AttnDtype, const void*, const void*, const void*, void*, float*,
                                         tiled_attn::AttnStrides, tiled_attn::AttnStrides, tiled_attn::AttnStrides,
                                         float)>;

struct CaseRun {
  std::string tag;        // printed after ok / FAIL ("" for none)
  std::string entry;      // the entry point, named when it returns an error
  std::string unwritten;  // why an output element may be left non-finite, in that failure's message
  // Called once the inputs are drawn, before the launch (may draw from rng); returns what the result
  // line prints after the scale.
  std::function<std::string(std::mt19937&)> prepare;
  Launch launch;
};

// q, k, v laid out (B, N, H, D) with the seq stride padded (a non-contiguous view); out (B, Nq, Hq, D)
// with a padded head stride, lse (B, Hq, Nq); guard elements around everything.
template <typename T>
bool run_case(const Case& c, std::mt19937& rng, const CaseRun& run) {
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
  const std::string extra = run.prepare ? run.prepare(rng) : std::string();

  const uint16_t* qp = q.data() + guard;
  const uint16_t* kp = k.data() + guard;
  const uint16_t* vp = v.data() + guard;
  emu::g_inputs = {{reinterpret_cast<const char*>(qp), q_elems * 2},
                   {reinterpret_cast<const char*>(kp), k_elems * 2},
                   {reinterpret_cast<const char*>(vp), k_elems * 2}};
  // The float the kernel gets, and the reference uses exactly that value.
  const bool zero_scale = c.scale == 0 && std::signbit(c.scale);
  const double scale =
      static_cast<float>(zero_scale ? 0.0 : c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d)));
  const tiled_attn::AttnStrides qs{q_batch, c.d, q_seq}, ks{k_batch, c.d, k_seq}, os{o_batch, o_head, o_seq};
  const cudaError_t err = run.launch(c.bf16 ? tiled_attn::AttnDtype::kBFloat16 : tiled_attn::AttnDtype::kFloat16, qp,
                                     kp, vp, out.data() + guard, lse.data() + guard, qs, ks, os,
                                     static_cast<float>(scale));
  if (err != cudaSuccess) emu::fail(run.entry + " returned " + std::to_string(static_cast<int>(err)));

  // float64 reference on the rounded inputs.
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
            emu::fail("output element not finite (" + run.unwritten + ") at b=" + std::to_string(b) +
                      " h=" + std::to_string(h) + " i=" + std::to_string(i) + " e=" + std::to_string(e));
          }
          max_err = std::max(max_err, err);
        }
      }
    }
  }
  // Nothing outside the elements: guards and the head-stride padding keep the poison.
  for (size_t i = 0; i < out.size(); ++i) {
    const bool inside = i >= static_cast<size_t>(guard) && i < out.size() - guard &&
                        ((i - guard) % o_head) < static_cast<size_t>(c.d);
    if (!inside && out[i] != kPoison) emu::fail("write outside out's elements at index " + std::to_string(i));
  }
  for (int i = 0; i < guard; ++i) {
    if (!std::isnan(lse[i]) || !std::isnan(lse[lse.size() - 1 - i])) emu::fail("write outside lse");
  }
  // fp16/bf16 rounding of P and of the output: ~2^-11 / 2^-8 relative on O(1) values.
  const double tol = c.bf16 ? 2e-2 : 3e-3;
  const bool ok = max_err <= tol && max_lse_err <= 1e-3;
  const std::string tag = run.tag.empty() ? run.tag : run.tag + " ";
  std::printf("%s %sD=%3d %s B=%d Hq=%d Hkv=%d Nq=%4d Nk=%4d causal=%d offset=%5lld scale=%+.3f %s  "
              "max|out-ref|=%.2e  max|lse-ref|=%.2e\n",
              ok ? "ok  " : "FAIL", tag.c_str(), c.d, c.bf16 ? "bf16" : "fp16", c.b, c.hq, c.hkv, c.nq, c.nk,
              c.causal, static_cast<long long>(c.offset), scale, extra.c_str(), max_err, max_lse_err);
  std::fflush(stdout);
  return ok;
}

// Runs one case in its dtype and counts it; an exception (a failed check) is a FAIL line.
inline void run_counted(const Case& c, std::mt19937& rng, const CaseRun& run, int& failed, int& ran) {
  ++ran;
  try {
    const bool ok = c.bf16 ? run_case<__nv_bfloat16>(c, rng, run) : run_case<__half>(c, rng, run);
    if (!ok) ++failed;
  } catch (const std::exception& e) {
    ++failed;
    const std::string tag = run.tag.empty() ? run.tag : run.tag + " ";
    std::printf("FAIL %sD=%3d %s Nq=%d Nk=%d causal=%d: %s\n", tag.c_str(), c.d, c.bf16 ? "bf16" : "fp16", c.nq, c.nk,
                c.causal, e.what());
    std::fflush(stdout);
  }
}

// The command line both emulators take: a head dim (0: all), then a seed (inputs and thread schedule).
struct Args {
  int only_d;
  unsigned seed;
};
inline Args parse_args(int argc, char** argv) {
  const Args a{argc > 1 ? std::atoi(argv[1]) : 0,
               argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : 20261122u};
  std::printf("seed %u\n", a.seed);
  emu::g_sched_rng.seed(a.seed);
  return a;
}

}  // namespace emu_cases
