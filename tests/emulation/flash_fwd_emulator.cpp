// flash_fwd_emulator.cpp: runs csrc/attention/flash_fwd_kernel.cuh on the CPU, unchanged, with every
// warp-level instruction it uses (ldmatrix, mma.sync, cp.async, shfl, __syncthreads) emulated from the
// PTX ISA's own tables, written here independently of the kernel's lane arithmetic. Each CUDA thread is
// a ucontext fiber; a warp collective waits for its 32 lanes, then computes every lane's result at once.
// Checked per case against a float64 reference: output and lse (rows with no visible key: exactly 0 and
// -inf), no write outside out/lse's elements, and shared-memory hazards: a cp.async destination read
// before its wait_group, or read / overwritten by another warp with no __syncthreads in between.
// Split-KV cases (Case::splits > 0) run attention_fwd_split: the split kernel (flash_fwd_kernel<Tr, T,
// true>, its grid.z the key splits) and the merge kernel (attention_merge.cuh), with the workspace
// NaN-poisoned between guards: every partial must be written, nothing outside it.
//
// Build and run (CPU only; tests/test_cuda_attention_kernel.py does this):
//   g++ -std=c++17 -O1 -Wno-attributes -I<cuda>/include -Icsrc -DTILED_ATTN_EMULATION
//       tests/emulation/flash_fwd_emulator.cpp -o /tmp/flash_fwd_emulator && /tmp/flash_fwd_emulator
// Optional arguments: a head dim (0: all) to run only its cases, and a seed for the inputs and the
// thread schedule (default fixed; tests/test_cuda_attention_kernel.py passes a fresh one).
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
// Round-to-nearest float arithmetic (CompensatedState in online_softmax.cuh; the emulator builds with
// -std=c++17, which keeps g++ from contracting these into FMAs).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

namespace emu {
constexpr int kMaxSmem = 232448;  // the sm90 per-block opt-in limit (227 KB)
}  // namespace emu

// The kernel's `extern __shared__ unsigned char smem_raw[]` (a block-scope extern in this namespace).
namespace tiled_attn {
namespace flash_fwd {
alignas(16) unsigned char smem_raw[emu::kMaxSmem];
}  // namespace flash_fwd
}  // namespace tiled_attn

namespace emu {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

unsigned char* const g_smem = tiled_attn::flash_fwd::smem_raw;
int g_smem_bytes = 0;  // this launch's dynamic shared memory
int g_epoch = 0;       // __syncthreads completed in this block

// Per shared-memory byte: hazard bookkeeping.
struct ByteState {
  int write_epoch = -1, writer_warp = -1, writer_tid = -1;  // last completed write
  bool async_write = false;                // by cp.async: visible to any thread only after a barrier
  int read_epoch = -1, reader_warp = -1;   // last read (-2: several warps in that epoch)
  int pending = 0;                         // cp.async issued and not yet complete
};
std::vector<ByteState> g_bytes(kMaxSmem);

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
  std::deque<std::vector<Copy>> groups;  // committed, not complete
};

struct Collective {  // one warp's rendezvous
  int arrived = 0;
  long generation = 0;
  std::string op;
  uint32_t in_u[32][8];
  float in_f[32][4];
  uint32_t out_u[32][4];
  float out_f[32][4];
};

std::vector<Fiber> g_fibers;
std::vector<Collective> g_warps;
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
  if (addr >= static_cast<uint32_t>(g_smem_bytes)) fail(std::string(what) + ": shared address past the allocation");
  ByteState& b = g_bytes[addr];
  if (b.pending) fail(std::string(what) + ": reads a cp.async destination before its wait_group + barrier");
  if (b.write_epoch == g_epoch && (b.async_write || b.writer_warp != cur_warp()))
    fail(std::string(what) + ": reads data written by cp.async or by another warp with no __syncthreads in between");
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp()) b.reader_warp = -2;
  else b.reader_warp = cur_warp();
  b.read_epoch = g_epoch;
}

void check_byte_write(uint32_t addr, const char* what) {
  if (addr >= static_cast<uint32_t>(g_smem_bytes)) fail(std::string(what) + ": shared address past the allocation");
  ByteState& b = g_bytes[addr];
  if (b.read_epoch == g_epoch && b.reader_warp != cur_warp())
    fail(std::string(what) + ": overwrites data another warp read with no __syncthreads in between");
}

// Warp rendezvous: every lane deposits its inputs; the last to arrive runs `compute` for all lanes.
void warp_collective(const std::string& op, const std::function<void(Collective&)>& compute) {
  Collective& c = g_warps[cur_warp()];
  if (c.arrived == 0) c.op = op;
  else if (c.op != op) fail("lanes of one warp in different collectives (" + c.op + " vs " + op + "): divergence");
  const long gen = c.generation;
  if (++c.arrived == 32) {
    compute(c);
    c.arrived = 0;
    ++c.generation;
    for (int l = 0; l < 32; ++l) g_fibers[cur_warp() * 32 + l].blocked = false;
  } else {
    while (c.generation == gen) yield_blocked();
  }
}

void syncthreads() {
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
  warp_collective("shfl_xor" + std::to_string(offset), [&](Collective& cc) {
    for (int l = 0; l < 32; ++l) cc.out_f[l][0] = cc.in_f[l ^ offset][0];
  });
  return c.out_f[lane][0];
}

bool any_sync(bool pred) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  c.in_u[lane][0] = pred;
  warp_collective("any", [&](Collective& cc) {
    uint32_t any = 0;
    for (int l = 0; l < 32; ++l) any |= cc.in_u[l][0];
    for (int l = 0; l < 32; ++l) cc.out_u[l][0] = any;
  });
  return c.out_u[lane][0] != 0;
}

uint16_t smem16(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, g_smem + addr, 2);
  return v;
}

// ldmatrix.m8n8.x4(.trans).b16 from the PTX ISA: lanes 8i..8i+7 give the row addresses of matrix i;
// without .trans lane l receives, in register i, matrix i's elements (row l/4, cols 2(l%4), 2(l%4)+1),
// with .trans (rows 2(l%4), 2(l%4)+1 of col l/4); the first element in the low 16 bits.
void ldmatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  if (addr % 16 != 0) fail("ldmatrix: row address not 16-byte aligned");
  for (int b = 0; b < 16; ++b) check_byte_read(addr + b, "ldmatrix");
  c.in_u[lane][0] = addr;
  warp_collective(trans ? "ldmatrix.trans" : "ldmatrix", [&](Collective& cc) {
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
          const uint32_t row = cc.in_u[8 * i + l / 4][0];
          lo = smem16(row + 2 * (2 * (l % 4)));
          hi = smem16(row + 2 * (2 * (l % 4) + 1));
        } else {
          lo = smem16(cc.in_u[8 * i + 2 * (l % 4)][0] + 2 * (l / 4));
          hi = smem16(cc.in_u[8 * i + 2 * (l % 4) + 1][0] + 2 * (l / 4));
        }
        cc.out_u[l][i] = lo | (uint32_t{hi} << 16);
      }
    }
  });
  for (int i = 0; i < 4; ++i) r[i] = c.out_u[lane][i];
}

template <typename T>
double to_double(uint16_t bits) {
  T v;
  std::memcpy(static_cast<void*>(&v), &bits, 2);
  if constexpr (std::is_same<T, __half>::value) return __half2float(v);
  else return __bfloat162float(v);
}

// mma.m16n8k16.row.col, fragments from the PTX ISA (g = lane/4, t = lane%4):
//   A: a0,a1 (row g, k 2t,2t+1)  a2,a3 (row g+8, k 2t,2t+1)  a4,a5 (row g, k 2t+8,+9)  a6,a7 (row g+8, k 2t+8,+9)
//   B: b0,b1 (k 2t,2t+1, col g)  b2,b3 (k 2t+8,2t+9, col g)
//   C: c0,c1 (row g, col 2t,2t+1)  c2,c3 (row g+8, col 2t,2t+1)
template <typename T>
void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Collective& c = g_warps[cur_warp()];
  const int lane = cur_lane();
  for (int i = 0; i < 4; ++i) c.in_u[lane][i] = a[i];
  c.in_u[lane][4] = b0;
  c.in_u[lane][5] = b1;
  for (int i = 0; i < 4; ++i) c.in_f[lane][i] = acc[i];
  warp_collective("mma", [&](Collective& cc) {
    double A[16][16], B[16][8], C[16][8];
    auto half_of = [](uint32_t reg, int which) { return static_cast<uint16_t>(which ? reg >> 16 : reg & 0xffff); };
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 8; ++e) {
        const int row = (e < 2 || (e >= 4 && e < 6)) ? g : g + 8;
        const int col = 2 * t + (e & 1) + (e >= 4 ? 8 : 0);
        A[row][col] = to_double<T>(half_of(cc.in_u[l][e / 2], e & 1));
      }
      for (int e = 0; e < 4; ++e) {
        const int k = 2 * t + (e & 1) + (e >= 2 ? 8 : 0);
        B[k][g] = to_double<T>(half_of(cc.in_u[l][4 + e / 2], e & 1));
      }
      for (int e = 0; e < 4; ++e) C[e < 2 ? g : g + 8][2 * t + (e & 1)] = cc.in_f[l][e];
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? g : g + 8, col = 2 * t + (e & 1);
        double d = C[row][col];
        for (int k = 0; k < 16; ++k) d += A[row][k] * B[k][col];
        cc.out_f[l][e] = static_cast<float>(d);
      }
    }
  });
  for (int i = 0; i < 4; ++i) acc[i] = c.out_f[lane][i];
}

void complete_group(std::vector<Copy>& group) {
  for (const Copy& cp : group) {
    for (int b = 0; b < 16; ++b) {
      ByteState& s = g_bytes[cp.dst + b];
      --s.pending;
      s.write_epoch = g_epoch;
      s.writer_warp = cur_warp();
      s.writer_tid = cur().tid;
      s.async_write = true;
    }
    if (cp.pred) std::memcpy(g_smem + cp.dst, cp.src, 16);
    else std::memset(g_smem + cp.dst, 0, 16);
  }
}

void cp_async(uint32_t dst, const void* src, bool pred) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async: address not 16-byte aligned");
  bool in_bounds = false;
  for (const Buffer& b : g_inputs) {
    const char* p = static_cast<const char*>(src);
    if (p >= b.begin && p + 16 <= b.begin + b.bytes) in_bounds = true;
  }
  // Even a zero-fill (src-size 0) gets an in-bounds address: the kernel clamps it to row 0.
  if (!in_bounds) fail(pred ? "cp.async: reads outside q/k/v" : "cp.async zero-fill: source address outside q/k/v");
  for (int b = 0; b < 16; ++b) {
    check_byte_write(dst + b, "cp.async");
    if (g_bytes[dst + b].pending) fail("cp.async: two copies in flight to the same shared bytes");
    ++g_bytes[dst + b].pending;
  }
  cur().open_group.push_back({dst, src, pred});
}

void commit() {
  cur().groups.push_back(std::move(cur().open_group));
  cur().open_group.clear();
}

void wait_group(int n) {
  if (!cur().open_group.empty()) fail("cp.async.wait_group with uncommitted copies (they would not be waited for)");
  while (static_cast<int>(cur().groups.size()) > n) {
    complete_group(cur().groups.front());
    cur().groups.pop_front();
  }
}

std::function<void()> g_body;
std::string g_error;  // the first failure inside a fiber; the scheduler rethrows it
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

// One CTA: all threads as fibers, scheduled in a random order among the runnable ones.
void run_block(int threads, const std::function<void()>& body) {
  g_body = body;
  g_fibers.assign(threads, Fiber{});
  g_warps.assign(threads / 32, Collective{});
  g_barrier_arrived = 0;
  g_epoch = 0;
  g_error.clear();
  std::memset(g_smem, 0xff, kMaxSmem);  // NaN in fp16 and bf16: unwritten shared memory shows
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
#define __any_sync(mask, pred) ::emu::any_sync(pred)

namespace tiled_attn {
namespace flash_fwd {
inline uint32_t smem_u32(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < emu::g_smem || c >= emu::g_smem + emu::kMaxSmem) emu::fail("smem_u32 of a non-shared pointer");
  return static_cast<uint32_t>(c - emu::g_smem);
}
inline void cp_async_16(uint32_t dst, const void* src, bool pred) { emu::cp_async(dst, src, pred); }
inline void cp_async_16_full(uint32_t dst, const void* src) { emu::cp_async(dst, src, true); }
inline void cp_async_commit() { emu::commit(); }
template <int N>
inline void cp_async_wait() {
  emu::wait_group(N);
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, true); }
template <typename T>
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma<T>(c, a, b0, b1);
}
inline void st_shared_b32(void* p, uint32_t v) {
  const uint32_t a = smem_u32(p);
  if (a % 4 != 0) emu::fail("st.shared.b32 misaligned");
  for (int b = 0; b < 4; ++b) {
    emu::check_byte_write(a + b, "st.shared");
    emu::ByteState& s = emu::g_bytes[a + b];
    if (s.pending) emu::fail("st.shared: overwrites a cp.async destination in flight");
    if (s.async_write && s.write_epoch == emu::g_epoch && s.writer_tid != emu::cur().tid)
      emu::fail("st.shared: overwrites another thread's cp.async data with no __syncthreads in between");
    s.write_epoch = emu::g_epoch;
    s.writer_warp = emu::cur_warp();
    s.writer_tid = emu::cur().tid;
    s.async_write = false;
  }
  std::memcpy(p, &v, 4);
}
inline uint4 ld_shared_b128(const void* p) {
  const uint32_t a = smem_u32(p);
  if (a % 16 != 0) emu::fail("ld.shared.b128 misaligned");
  for (int b = 0; b < 16; ++b) emu::check_byte_read(a + b, "ld.shared");
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
}
}  // namespace flash_fwd
}  // namespace tiled_attn

#include "attention/attention_merge.cuh"
#include "attention/flash_fwd_launch.cuh"
#include "attention/sweep/flash_fwd_sweep.cuh"

// launch_kernel (declared in flash_fwd_launch.cuh, which uses <<<>>> on the GPU), for the emulator:
// same grid, same slices, every CTA run in turn. Everything above it (the per-head-dim TileConfig
// dispatch, the kFold sibling for scale <= 0) is the GPU build's own code.
namespace tiled_attn {
namespace flash_fwd {
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
        emu::run_block(Tr::kThreads, [&] { flash_fwd_kernel<Tr, T>(params); });
      }
    }
  }
  return cudaSuccess;
}

// The split-KV kernel's launch (flash_fwd_launch.cuh): the same grid, grid.z the key splits.
template <class Tr, typename T>
cudaError_t launch_split_kernel(Params params, int slots, cudaStream_t) {
  if (Tr::kSmemBytes > emu::kMaxSmem) return cudaErrorInvalidValue;
  emu::g_smem_bytes = Tr::kSmemBytes;
  const unsigned m_blocks = static_cast<unsigned>((params.seqlen_q * params.group + Tr::kBlockM - 1) / Tr::kBlockM);
  for (int64_t first = 0; first < slots; first += kMaxGridY) {
    params.bh_offset = static_cast<int>(first);
    const unsigned gy = static_cast<unsigned>(std::min<int64_t>(kMaxGridY, slots - first));
    const unsigned gz = static_cast<unsigned>(params.num_splits);
    emu::g_grid_dim = {m_blocks, gy, gz};
    for (unsigned bz = 0; bz < gz; ++bz) {
      for (unsigned by = 0; by < gy; ++by) {
        for (unsigned bx = 0; bx < m_blocks; ++bx) {
          emu::g_block_idx = {bx, by, bz};
          emu::run_block(Tr::kThreads, [&] { flash_fwd_kernel<Tr, T, true>(params); });
        }
      }
    }
  }
  return cudaSuccess;
}

// The merge kernel's launch (attention_merge.cu): the same 1-D grid of kMergeThreads-thread blocks.
template <int kHeadDim, typename T>
cudaError_t launch_merge_kernel(const MergeParams& p, cudaStream_t) {
  const int64_t blocks = (p.rows * (kHeadDim / 4) + kMergeThreads - 1) / kMergeThreads;
  emu::g_smem_bytes = 0;
  emu::g_grid_dim = {static_cast<unsigned>(blocks), 1, 1};
  for (int64_t bx = 0; bx < blocks; ++bx) {
    emu::g_block_idx = {static_cast<unsigned>(bx), 0, 0};
    emu::run_block(kMergeThreads, [&] { attention_merge_kernel<kHeadDim, T>(p); });
  }
  return cudaSuccess;
}
}  // namespace flash_fwd
}  // namespace tiled_attn

#include "attention/attention_merge.cu"
#include "attention/flash_fwd.cu"

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
  double scale = 0;  // 0: 1/sqrt(d); kZeroScale: a softmax scale of exactly 0
  int splits = 0;    // 0: attention_fwd; >= 1: attention_fwd_split with that many key splits
};
constexpr double kZeroScale = -0.0;  // a sentinel distinct from the default (checked with signbit)

// Who runs a case: attention_fwd (the extension's entry: TileConfig dispatch) or one sweep variant.
using Launcher = std::function<cudaError_t(tiled_attn::AttnDtype, const void*, const void*, const void*, void*, float*,
                                           const Case&, tiled_attn::AttnStrides, tiled_attn::AttnStrides,
                                           tiled_attn::AttnStrides, float)>;

cudaError_t via_attention_fwd(tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out,
                              float* lse, const Case& c, tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks,
                              tiled_attn::AttnStrides os, float scale) {
  if (c.splits == 0) {
    return tiled_attn::attention_fwd(dtype, q, k, v, out, lse, c.b, c.hq, c.hkv, c.nq, c.nk, c.d, qs, ks, ks, os,
                                     scale, c.causal, c.offset, nullptr);
  }
  // Split-KV: the workspace NaN-poisoned (a partial the merge reads unwritten shows in the output)
  // between guards that must stay untouched.
  const int64_t floats = tiled_attn::attention_split_workspace_floats(c.b, c.hq, c.nq, c.d, c.splits);
  const int guard = 64;
  std::vector<float> ws(static_cast<size_t>(floats) + 2 * guard, std::nanf(""));
  const std::vector<float> poison = ws;
  const cudaError_t err =
      tiled_attn::attention_fwd_split(dtype, q, k, v, out, lse, ws.data() + guard, c.splits, c.b, c.hq, c.hkv, c.nq,
                                      c.nk, c.d, qs, ks, ks, os, scale, c.causal, c.offset, nullptr);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < guard; ++i) {
    if (!std::isnan(ws[i]) || !std::isnan(ws[ws.size() - 1 - i])) emu::fail("split kernel wrote outside its workspace");
  }
  // Every partial written (acc, m, l of every row and split): none left NaN.
  for (int64_t i = 0; i < floats; ++i) {
    if (std::isnan(ws[guard + i])) emu::fail("workspace element " + std::to_string(i) + " not written by the split kernel");
  }
  return err;
}

// Sweep variant I through make_params and run_flash_fwd_cfg (so a kFold variant at scale <= 0 runs
// its sibling without the fold, as the extension would).
template <int I>
cudaError_t via_variant(tiled_attn::AttnDtype dtype, const void* q, const void* k, const void* v, void* out,
                        float* lse, const Case& c, tiled_attn::AttnStrides qs, tiled_attn::AttnStrides ks,
                        tiled_attn::AttnStrides os, float scale) {
  namespace ff = tiled_attn::flash_fwd;
  ff::Params p;
  int batch_heads;
  const cudaError_t err = ff::make_params(q, k, v, out, lse, c.b, c.hq, c.hkv, c.nq, c.nk, qs, ks, ks, os, scale,
                                          c.causal, c.offset, p, batch_heads);
  if (err != cudaSuccess || batch_heads == 0) return err;
  constexpr int kD = ff::kSweep[I].head_dim;
  if (dtype == tiled_attn::AttnDtype::kFloat16) return ff::run_flash_fwd_cfg<kD, ff::SweepCfg<I>, __half>(p, batch_heads, nullptr);
  return ff::run_flash_fwd_cfg<kD, ff::SweepCfg<I>, __nv_bfloat16>(p, batch_heads, nullptr);
}
template <size_t... I>
std::vector<Launcher> variant_launchers(std::index_sequence<I...>) {
  return {Launcher(via_variant<static_cast<int>(I)>)...};
}

// q, k, v laid out (B, N, H, D) with the seq stride padded (a non-contiguous view); out (B, Nq, Hq, D)
// with a padded head stride, lse (B, Hq, Nq); guard elements around everything.
template <typename T>
bool run_case(const Case& c, std::mt19937& rng, const Launcher& launch, const char* who) {
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
  const cudaError_t err = launch(c.bf16 ? tiled_attn::AttnDtype::kBFloat16 : tiled_attn::AttnDtype::kFloat16, qp, kp,
                                 vp, out.data() + guard, lse.data() + guard, c, qs, ks, os, static_cast<float>(scale));
  if (err != cudaSuccess) emu::fail("attention_fwd returned " + std::to_string(static_cast<int>(err)));

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
          if (!(e <= 1e30)) emu::fail("lse not finite where the reference is");
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
            emu::fail("output element not finite (unwritten?) at b=" + std::to_string(b) + " h=" + std::to_string(h) +
                      " i=" + std::to_string(i) + " e=" + std::to_string(e));
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
  std::printf("%s %s D=%3d %s B=%d Hq=%d Hkv=%d Nq=%4d Nk=%4d causal=%d offset=%5lld scale=%+.3f splits=%d  "
              "max|out-ref|=%.2e  max|lse-ref|=%.2e\n",
              ok ? "ok  " : "FAIL", who, c.d, c.bf16 ? "bf16" : "fp16", c.b, c.hq, c.hkv, c.nq, c.nk, c.causal,
              static_cast<long long>(c.offset), scale, c.splits, max_err, max_lse_err);
  return ok;
}

}  // namespace

// Optional arguments: a head dim (0: all), a seed, and which kernels: "default" (attention_fwd: the
// TileConfig rows), "variants" (every sweep variant of that head dim), or "all" (the default).
int main(int argc, char** argv) {
  const int only_d = argc > 1 ? std::atoi(argv[1]) : 0;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : 20261122u;
  const std::string which = argc > 3 ? argv[3] : "all";
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  emu::g_sched_rng.seed(seed);
  // Cases per head dim; `core` ones also run for every sweep variant of that head dim.
  std::vector<std::pair<Case, bool>> cases;
  for (int d : {32, 64, 96, 128, 192, 256}) {
    if (only_d && d != only_d) continue;
    const bool bf = d % 64 != 0;  // alternate the dtype across head dims; both on D = 64 and 128 below
    // ragged, several key tiles, GQA; non-causal
    cases.push_back({{2, 4, 2, 77, 150, d, false, 0, bf}, true});
    // bottom-right causal with Nq < Nk, two query tiles for the 64-row configs
    cases.push_back({{1, 2, 1, 100, 203, d, true, 203 - 100, !bf}, true});
    // Nq > Nk bottom-right: the first rows see no key (output 0, lse -inf)
    cases.push_back({{1, 2, 2, 150, 70, d, true, 70 - 150, bf}, true});
    // several query tiles of the 256-row configs, ragged both ways, rows with no key; the other dtype
    cases.push_back({{1, 1, 1, 300, 290, d, true, -20, !bf}, true});
    // negative and zero scale (kFold's sibling path): full tiles, non-causal and causal
    cases.push_back({{1, 1, 1, 64, 128, d, false, 0, bf, -0.3}, true});
    cases.push_back({{1, 1, 1, 64, 128, d, true, 64, !bf, kZeroScale}, true});
    if (d == 64 || d == 128) {
      // top-left causal over two query tiles (diagonal inside tiles), MQA, the other dtype
      cases.push_back({{1, 3, 1, 200, 200, d, true, 0, bf}, false});
      cases.push_back({{1, 3, 1, 200, 200, d, true, 0, !bf}, false});
      // one query, one key; no keys at all; an offset past every key (nothing masked)
      cases.push_back({{1, 1, 1, 1, 1, d, false, 0, false}, true});
      cases.push_back({{1, 2, 1, 5, 0, d, false, 0, true}, true});
      cases.push_back({{1, 1, 1, 130, 65, d, true, 1 << 30, false}, false});
      cases.push_back({{1, 1, 1, 33, 65, d, true, -(1LL << 40), true}, false});
    }
    // Split-KV (attention_fwd_split: flash_fwd_kernel<Tr, T, true> and the merge kernel). Every head
    // dim: Nq = 1 with GQA group 4 packed in one tile, and Nq = 3 causal where the last split is
    // invisible to queries 0 and 1 (keys [128, 129) past their limits 127 and 128).
    cases.push_back({{1, 4, 1, 1, 150, d, false, 0, bf, 0, 3}, false});
    cases.push_back({{1, 4, 2, 3, 129, d, true, 129 - 3, !bf, 0, 3}, false});
    if (d == 64 || d == 128) {
      // Nq = 1, group 4 (B = 2, Hq = 8, Hkv = 2), ragged Nk, 1 to 7 splits (Nk = 1 with 2 splits and
      // Nk = 239 with 7: splits past the keys, which write the identity).
      const std::pair<int, int> decode[] = {{1, 1}, {1, 2}, {239, 1}, {239, 4}, {239, 7}, {799, 5}, {4099, 7}};
      int n = 0;
      for (const auto& [nk, splits] : decode) {
        cases.push_back({{2, 8, 2, 1, nk, d, false, 0, (n++ % 2) != 0, 0, splits}, false});
      }
      // Nq = 1 bottom-right causal (sees every key), group 1 (MHA) and group 4
      cases.push_back({{1, 2, 2, 1, 799, d, true, 799 - 1, bf, 0, 3}, false});
      cases.push_back({{1, 4, 1, 1, 4099, d, true, 4099 - 1, !bf, 0, 6}, false});
      // Nq = 3, group 4, bottom-right causal: 6 splits over 239 keys (4 of 64, 2 past the keys), 7 over
      // 799 and 4099
      cases.push_back({{1, 8, 2, 3, 239, d, true, 239 - 3, bf, 0, 6}, false});
      cases.push_back({{1, 8, 2, 3, 799, d, true, 799 - 3, !bf, 0, 7}, false});
      cases.push_back({{1, 4, 1, 3, 4099, d, true, 4099 - 3, bf, 0, 7}, false});
      // Nq = 3, MQA group 8: 24 packed rows over two 16-row tiles; top-left causal (rows see 1-3 keys:
      // splits 1-4 empty for every row), and non-causal with group 1
      cases.push_back({{1, 8, 1, 3, 799, d, true, 0, !bf, 0, 5}, false});
      cases.push_back({{2, 3, 3, 3, 239, d, false, 0, bf, 0, 2}, false});
      // Nq > Nk: queries 0 and 1 see no key (output 0, lse -inf) in every split
      cases.push_back({{1, 4, 2, 3, 1, d, true, 1 - 3, !bf, 0, 2}, false});
      // negative and zero scale (the kFold sibling of the split kernel)
      cases.push_back({{1, 4, 1, 1, 239, d, false, 0, bf, -0.3, 3}, false});
      cases.push_back({{1, 4, 1, 3, 239, d, true, 239 - 3, !bf, kZeroScale, 3}, false});
    }
  }
  namespace ff = tiled_attn::flash_fwd;
  const std::vector<Launcher> variants = variant_launchers(std::make_index_sequence<ff::kNumSweep>{});
  int failed = 0, ran = 0;
  auto run = [&](const Case& c, const Launcher& launch, const std::string& who) {
    ++ran;
    try {
      const bool ok = c.bf16 ? run_case<__nv_bfloat16>(c, rng, launch, who.c_str())
                             : run_case<__half>(c, rng, launch, who.c_str());
      if (!ok) ++failed;
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s D=%3d Nq=%d Nk=%d causal=%d: %s\n", who.c_str(), c.d, c.nq, c.nk, c.causal, e.what());
    }
  };
  for (const auto& [c, core] : cases) {
    if (which != "variants") run(c, via_attention_fwd, "default");
    if (which == "default" || !core) continue;
    for (int i = 0; i < ff::kNumSweep; ++i) {
      if (ff::kSweep[i].head_dim == c.d) run(c, variants[i], "variant" + std::to_string(i));
    }
  }
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
