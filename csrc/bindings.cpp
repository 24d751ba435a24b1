// bindings.cpp: the only file that includes torch headers (DESIGN §2). It turns tensors into raw
// pointers, int64 sizes and strides, the launch config into LaunchConfig and the stream (an int:
// torch.cuda.current_stream().cuda_stream) into a cudaStream_t, calls the launchers of
// csrc/softmax/ and csrc/attention/, and returns their errors, never throws them (Checker and
// to_text below say why): a string "Kind: message" that tiled_attn/cuda/_build.py call() raises as
// a Python exception (RuntimeError for a CUDA error, ValueError/TypeError for operands a kernel
// cannot take, before anything launches; "" = success).
// Only torch/extension.h is used (no ATen/cuda, c10/cuda headers), so this compiles against a CPU
// torch wheel too; the device guard below is plain CUDA runtime.
#include <torch/extension.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "softmax/softmax.h"
#if TILED_ATTN_WITH_ATTENTION
#include "attention/attention.h"
#if TILED_ATTN_WITH_SM90  // the wgmma forward (csrc/attention/sm90/), built for compute capability 9.0 only
#include "attention/sm90/attention_sm90.h"
#endif
#endif

namespace {

namespace sm = tiled_attn::softmax;

// Makes `device` current for the launch and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (device != previous_) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

cudaStream_t as_stream(int64_t stream) { return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(stream)); }

// Message text, built without std::ostream. On the H100 machine (torch 2.11+cu130) an extension
// inserting an integer into a std::ostream dies with SIGSEGV: its CXX (/opt/gcc/bin/g++, g++ 13.3)
// has only a static libstdc++.a, so the extension carries a private copy of libstdc++'s locale code
// (its own locale::id numbering) and, formatting a number, takes the wrong facet from the process's
// locale (built by the shared libstdc++.so.6): std::ostream::_M_insert<long> called
// codecvt<char16_t>::do_unshift. Strings need no facet and pass. That, not the throw, killed every
// TORCH_CHECK whose message held a number (threads=33, a row limit, a shape); those without one (an
// unknown kernel, "got one on cpu") raised fine, and a bare extension built with CXX=/usr/bin/g++
// formats numbers fine. So numbers, shapes, devices and dtypes become text here, with
// std::to_string and c10's own functions, never c10::str or <<.
std::string to_text(const char* s) { return s; }
std::string to_text(const std::string& s) { return s; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string to_text(T v) {
  return std::to_string(v);
}
std::string to_text(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
std::string to_text(const c10::Device& d) { return d.str(); }
std::string to_text(c10::ScalarType t) { return c10::toString(t); }

// Errors are returned, never thrown: the H100 runs died with SIGSEGV on this extension's failed
// TORCH_CHECKs (while building their message, to_text above says why), so each bound function now
// checks its arguments with a Checker and hands the first failure back as a plain value, no C++
// exception on the path. The Checker keeps the first failed check as "ValueError: <msg>" /
// "TypeError: <msg>" / "RuntimeError: <msg>"; the function returns that string ("" = success) and
// tiled_attn/cuda/_build.py call() raises it in Python. Each check returns false once any check has
// failed, so callers chain them with && or return at the first false: nothing after a failed check
// reads the operands (no size(i) past a wrong dim, no data_ptr(), no allocation).
class Checker {
 public:
  template <typename... Args>
  bool value(bool ok, const Args&... msg) { return check(ok, "ValueError", msg...); }
  template <typename... Args>
  bool type(bool ok, const Args&... msg) { return check(ok, "TypeError", msg...); }
  template <typename... Args>
  bool runtime(bool ok, const Args&... msg) { return check(ok, "RuntimeError", msg...); }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  template <typename... Args>
  bool check(bool ok, const char* kind, const Args&... msg) {
    if (!error_.empty()) return false;
    if (!ok) {
      error_ = std::string(kind) + ": ";
      (error_.append(to_text(msg)), ...);
    }
    return ok;
  }

  std::string error_;
};

bool check_launch(Checker& chk, cudaError_t err, const std::string& what) {
  return chk.runtime(err == cudaSuccess, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                     ")");
}

// A uint8 scratch tensor on `like`'s device. torch::empty throws when out of memory: caught right
// here and returned like every other error.
bool allocate_workspace(Checker& chk, int64_t bytes, const torch::Tensor& like, torch::Tensor* workspace) {
  if (!chk.ok()) return false;
  try {
    *workspace = torch::empty({bytes}, like.options().dtype(torch::kUInt8));
  } catch (const c10::Error& e) {
    return chk.runtime(false, "allocating ", bytes, " bytes of workspace failed: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return chk.runtime(false, "allocating ", bytes, " bytes of workspace failed: ", e.what());
  }
  return true;
}

bool softmax_dtype(Checker& chk, const torch::Tensor& t, const char* name, sm::Dtype* dtype) {
  switch (t.scalar_type()) {
    case torch::kFloat: *dtype = sm::Dtype::kFloat32; return chk.ok();
    case torch::kHalf: *dtype = sm::Dtype::kFloat16; return chk.ok();
    case torch::kBFloat16: *dtype = sm::Dtype::kBFloat16; return chk.ok();
    default: break;
  }
  return chk.type(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
}

bool check_matrix(Checker& chk, const torch::Tensor& t, const char* name, const torch::Tensor& like, bool row_major) {
  return chk.value(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device()) &&
         chk.value(t.dim() == 2, name, " must be 2-D (rows, cols), got shape ", t.sizes()) &&
         chk.value(t.sizes() == like.sizes(), name, " must have shape ", like.sizes(), ", got ", t.sizes()) &&
         chk.value(t.device() == like.device(), name, " must be on ", like.device(), ", got ", t.device()) &&
         chk.type(t.scalar_type() == like.scalar_type(), name, " must have dtype ", like.scalar_type(), ", got ",
                  t.scalar_type()) &&
         chk.value(!row_major || t.size(1) <= 1 || t.stride(1) == 1, name,
                   " must be row-major (column stride 1), got strides ", t.strides());
}

bool launch_config(Checker& chk, int64_t threads, int64_t cluster, int64_t cta_bytes, int64_t chunk,
                   sm::LaunchConfig* cfg) {
  if (!(chk.value(threads >= 32 && threads <= sm::kMaxThreads && threads % 32 == 0,
                  "threads must be a multiple of 32 in [32, ", sm::kMaxThreads, "], got ", threads) &&
        chk.value(cluster >= 1 && cluster <= sm::kMaxCluster, "cluster must be in [1, ", sm::kMaxCluster, "], got ",
                  cluster))) {
    return false;
  }
  cfg->threads = static_cast<int>(threads);
  cfg->cluster = static_cast<int>(cluster);
  cfg->cta_bytes = cta_bytes;
  cfg->chunk = chunk;
  return true;
}

// Checks x and out for a forward launch; fills `a` (data_ptr included) only when all checks passed.
bool forward_args(Checker& chk, const torch::Tensor& x, const torch::Tensor& out, sm::ForwardArgs* a) {
  sm::Dtype dtype;
  if (!(check_matrix(chk, x, "x", x, false) && check_matrix(chk, out, "out", x, true) &&
        softmax_dtype(chk, x, "x", &dtype))) {
    return false;
  }
  a->dtype = dtype;
  a->x = x.data_ptr();
  a->x_row_stride = x.stride(0);
  a->x_col_stride = x.stride(1);
  a->y = out.data_ptr();
  a->y_row_stride = out.stride(0);
  a->rows = x.size(0);
  a->cols = x.size(1);
  return true;
}

using sm::ForwardKernel;
using sm::kForwardKernels;

// The kernel named `name`, or nullptr (and the error) when there is none.
const ForwardKernel* find_kernel(Checker& chk, const std::string& name) {
  std::string known;
  for (const auto& k : kForwardKernels) {
    if (name == k.name) return &k;
    known += known.empty() ? "" : ", ";
    known += k.name;
  }
  chk.value(false, "kernel must be one of ", known, ", got '", name, "'");
  return nullptr;
}

// The longest row the kernel takes for these operands on x's device; -1: any.
int64_t max_cols(const std::string& kernel, const sm::ForwardArgs& a, const sm::LaunchConfig& cfg, int device) {
  if (kernel == "block_row_reg") return sm::forward_block_row_reg_max_cols(a);
  if (kernel == "block_row_smem") return sm::forward_block_row_smem_max_cols(a, cfg, device);
  if (kernel == "flat_rows") return sm::forward_flat_rows_max_cols();
  return -1;
}

// (limit, error): the limit is meaningful only when error is "".
std::tuple<int64_t, std::string> softmax_max_cols(const std::string& kernel, const torch::Tensor& x,
                                                  const torch::Tensor& out, int64_t threads, int64_t cluster,
                                                  int64_t cta_bytes, int64_t chunk) {
  Checker chk;
  sm::ForwardArgs a;
  sm::LaunchConfig cfg;
  if (!(find_kernel(chk, kernel) && forward_args(chk, x, out, &a) &&
        launch_config(chk, threads, cluster, cta_bytes, chunk, &cfg))) {
    return {0, chk.error()};
  }
  return {max_cols(kernel, a, cfg, x.get_device()), ""};
}

std::string softmax_fwd(const std::string& kernel, const torch::Tensor& x, torch::Tensor& out, int64_t threads,
                        int64_t cluster, int64_t cta_bytes, int64_t chunk, int64_t stream) {
  Checker chk;
  sm::ForwardArgs a;
  sm::LaunchConfig cfg;
  const ForwardKernel* k = find_kernel(chk, kernel);
  if (!(k && forward_args(chk, x, out, &a) && launch_config(chk, threads, cluster, cta_bytes, chunk, &cfg))) {
    return chk.error();
  }
  if (a.rows == 0 || a.cols == 0) return "";
  const int device = x.get_device();
  const DeviceGuard guard(device);
  const int64_t limit = max_cols(kernel, a, cfg, device);
  if (!chk.value(limit < 0 || a.cols <= limit, "kernel='", kernel, "' takes rows of at most ", limit,
                 " columns for this dtype and layout on this device, got ", a.cols,
                 " (kernel='split_row' or kernel=None take any length)")) {
    return chk.error();
  }
  torch::Tensor workspace;
  const int64_t ws_bytes = kernel == "split_row" ? sm::forward_split_row_workspace_bytes(a, cfg) : 0;
  if (ws_bytes > 0 && !allocate_workspace(chk, ws_bytes, x, &workspace)) return chk.error();
  check_launch(chk, k->launch(a, cfg, ws_bytes > 0 ? workspace.data_ptr() : nullptr, as_stream(stream)),
               "CUDA softmax kernel '" + kernel + "'");
  return chk.error();
}

std::string softmax_bwd(const torch::Tensor& y, const torch::Tensor& dy, torch::Tensor& dx, int64_t threads,
                        int64_t chunk, int64_t stream) {
  Checker chk;
  sm::Dtype dtype;
  sm::LaunchConfig cfg;
  if (!(check_matrix(chk, y, "y", y, false) && check_matrix(chk, dy, "dy", y, false) &&
        check_matrix(chk, dx, "dx", y, true) && softmax_dtype(chk, y, "y", &dtype) &&
        launch_config(chk, threads, 1, 0, chunk, &cfg))) {
    return chk.error();
  }
  if (y.size(0) == 0 || y.size(1) == 0) return "";
  sm::BackwardArgs a;
  a.dtype = dtype;
  a.y = y.data_ptr();
  a.y_row_stride = y.stride(0);
  a.y_col_stride = y.stride(1);
  a.dy = dy.data_ptr();
  a.dy_row_stride = dy.stride(0);
  a.dy_col_stride = dy.stride(1);
  a.dx = dx.data_ptr();
  a.dx_row_stride = dx.stride(0);
  a.rows = y.size(0);
  a.cols = y.size(1);
  const DeviceGuard guard(y.get_device());
  torch::Tensor workspace;
  const int64_t ws_bytes = sm::backward_workspace_bytes(a, cfg);
  if (ws_bytes > 0 && !allocate_workspace(chk, ws_bytes, y, &workspace)) return chk.error();
  check_launch(chk, sm::backward(a, cfg, ws_bytes > 0 ? workspace.data_ptr() : nullptr, as_stream(stream)),
               "CUDA softmax backward");
  return chk.error();
}

// A test hook (tests/test_cuda_softmax.py): throws one kind of C++ exception from this extension's
// own code, so a process that dies of it (as the first H100 runs did on block_row_reg's limit check)
// tells apart "any C++ exception thrown here" from "a c10::Error" (whose constructor captures a
// backtrace by unwinding every frame on the stack).
void raise_for_test(const std::string& kind) {
  if (kind == "std") throw std::runtime_error("tiled_attn test exception (std::runtime_error)");
  TORCH_CHECK_VALUE(kind != "c10", "tiled_attn test exception (c10::ValueError)");
  TORCH_CHECK_VALUE(false, "kind must be 'std' or 'c10', got '", kind, "'");
}

#if TILED_ATTN_WITH_ATTENTION
tiled_attn::AttnStrides attn_strides(const torch::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

bool check_attn_operand(Checker& chk, const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  return chk.value(t.is_cuda() && t.device() == q.device(), name, " must be on ", q.device(), ", got ", t.device()) &&
         chk.value(t.dim() == 4, name, " must have 4 dims (B, H, N, D), got shape ", t.sizes()) &&
         chk.type(t.scalar_type() == q.scalar_type(), name, " must have q's dtype ", q.scalar_type(), ", got ",
                  t.scalar_type()) &&
         chk.value(t.size(3) <= 1 || t.stride(3) == 1, name, " must have a contiguous last dim, got strides ",
                   t.strides());
}

// The operand checks of the attention entries (attention_fwd, attention_fwd_split); false with the
// error in chk at the first failure.
bool check_attention_args(Checker& chk, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& out, const torch::Tensor& lse, tiled_attn::AttnDtype* dtype) {
  if (!chk.value(q.is_cuda(), "q must be a CUDA tensor, got one on ", q.device())) return false;
  if (q.scalar_type() == torch::kHalf) {
    *dtype = tiled_attn::AttnDtype::kFloat16;
  } else if (q.scalar_type() == torch::kBFloat16) {
    *dtype = tiled_attn::AttnDtype::kBFloat16;
  } else {
    chk.type(false, "the CUDA attention kernel takes float16 or bfloat16, got ", q.scalar_type());
    return false;
  }
  if (!(check_attn_operand(chk, q, "q", q) && check_attn_operand(chk, k, "k", q) &&
        check_attn_operand(chk, v, "v", q) && check_attn_operand(chk, out, "out", q) &&
        chk.value(k.sizes() == v.sizes(), "k and v must have the same shape, got ", k.sizes(), " and ", v.sizes()) &&
        chk.value(out.sizes() == q.sizes(), "out must have q's shape ", q.sizes(), ", got ", out.sizes()))) {
    return false;
  }
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1);
  if (!(chk.value(k.size(0) == batch && k.size(3) == head_dim, "k must be (", batch, ", Hkv, Nk, ", head_dim,
                  "), got ", k.sizes()) &&
        chk.value(heads_kv > 0 && heads_q % heads_kv == 0, "q's heads (", heads_q,
                  ") must be a multiple of k/v's heads (", heads_kv, ")") &&
        chk.value(tiled_attn::attention_head_dim_supported(head_dim), "head dim ", head_dim,
                  " is not instantiated in the CUDA attention kernel") &&
        chk.value(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == torch::kFloat &&
                      lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads_q &&
                      lse.size(2) == seqlen_q && lse.is_contiguous(),
                  "lse must be a contiguous float32 (B, Hq, Nq) tensor on q's device, got ", lse.sizes(), " ",
                  lse.scalar_type()))) {
    return false;
  }
  return true;
}

std::string attention_fwd(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                          torch::Tensor& lse, double scale, bool causal, int64_t causal_offset, int64_t stream) {
  Checker chk;
  tiled_attn::AttnDtype dtype;
  if (!check_attention_args(chk, q, k, v, out, lse, &dtype)) return chk.error();
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), seqlen_k = k.size(2);
  if (q.numel() == 0) return "";
  const DeviceGuard guard(q.get_device());
  check_launch(chk,
               tiled_attn::attention_fwd(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                         lse.data_ptr<float>(), batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                         head_dim, attn_strides(q), attn_strides(k), attn_strides(v),
                                         attn_strides(out), static_cast<float>(scale), causal, causal_offset,
                                         as_stream(stream)),
               "CUDA attention kernel");
  return chk.error();
}

// attention_fwd by split-KV (attention.h attention_fwd_split): `workspace` a contiguous float32 CUDA
// tensor of at least B·Hq·Nq·num_splits·(D + 2) elements on q's device (the caller allocates it on the
// launch's stream: tiled_attn/cuda/attention.py).
std::string attention_fwd_split(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                torch::Tensor& out, torch::Tensor& lse, torch::Tensor& workspace, int64_t num_splits,
                                double scale, bool causal, int64_t causal_offset, int64_t stream) {
  Checker chk;
  tiled_attn::AttnDtype dtype;
  if (!check_attention_args(chk, q, k, v, out, lse, &dtype)) return chk.error();
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), seqlen_k = k.size(2);
  if (!chk.value(num_splits >= 1 && num_splits <= 65535, "num_splits must be in [1, 65535], got ", num_splits)) {
    return chk.error();
  }
  const int64_t floats = tiled_attn::attention_split_workspace_floats(batch, heads_q, seqlen_q, head_dim, num_splits);
  if (!chk.value(workspace.is_cuda() && workspace.device() == q.device() &&
                     workspace.scalar_type() == torch::kFloat && workspace.is_contiguous() &&
                     workspace.numel() >= floats,
                 "workspace must be a contiguous float32 tensor of at least ", floats, " elements on q's device, got ",
                 workspace.sizes(), " ", workspace.scalar_type(), " on ", workspace.device())) {
    return chk.error();
  }
  if (q.numel() == 0) return "";
  const DeviceGuard guard(q.get_device());
  check_launch(chk,
               tiled_attn::attention_fwd_split(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                               lse.data_ptr<float>(), workspace.data_ptr<float>(), num_splits, batch,
                                               heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, attn_strides(q),
                                               attn_strides(k), attn_strides(v), attn_strides(out),
                                               static_cast<float>(scale), causal, causal_offset, as_stream(stream)),
               "CUDA split-KV attention kernels");
  return chk.error();
}

#if TILED_ATTN_WITH_SM90
// ---- wgmma attention forward (csrc/attention/sm90/attention_sm90.h; tiled_attn/cuda/attention.py
// kernel="wgmma" / "wgmma_ws") ----
// attention_fwd with an sm_90a wgmma kernel (warp_specialized: the TMA producer / consumer one): the same
// operand checks, its own head dims.
std::string attention_fwd_sm90(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               torch::Tensor& out, torch::Tensor& lse, double scale, bool causal,
                               int64_t causal_offset, int64_t stream, bool warp_specialized) {
  Checker chk;
  tiled_attn::AttnDtype dtype;
  if (!check_attention_args(chk, q, k, v, out, lse, &dtype)) return chk.error();
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), seqlen_k = k.size(2);
  if (!chk.value(tiled_attn::attention_sm90_head_dim_supported(head_dim, warp_specialized), "head dim ", head_dim,
                 warp_specialized ? " is not instantiated in the warp-specialized wgmma attention kernel"
                                  : " is not instantiated in the wgmma attention kernel")) {
    return chk.error();
  }
  if (q.numel() == 0) return "";
  const DeviceGuard guard(q.get_device());
  const auto entry = warp_specialized ? tiled_attn::attention_fwd_sm90_ws : tiled_attn::attention_fwd_sm90;
  check_launch(chk,
               entry(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr<float>(), batch,
                     heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, attn_strides(q), attn_strides(k),
                     attn_strides(v), attn_strides(out), static_cast<float>(scale), causal, causal_offset,
                     as_stream(stream)),
               warp_specialized ? "CUDA warp-specialized wgmma attention kernel" : "CUDA wgmma attention kernel");
  return chk.error();
}

// ---- wgmma attention backward (csrc/attention/sm90/attention_sm90.h attention_bwd_sm90;
// tiled_attn/cuda/attention_backward.py) ----
// dq_accum (zeroed by the caller) += Σ dS k; dk, dv overwritten. q, k, v, dout as the forward's operands
// (dout q's shape), lse and delta contiguous float32 (B, Hq, Nq), dq_accum contiguous float32
// (B·Hq, Nq, D), dk / dv k's shape, both in q's dtype or both float32 (a caller's unrounded partials);
// kv_split > 1: float32 (B, Hkv·kv_split, Nk, D), the partials of each GQA group's kv_split shares.
// longest_first: the CTAs in key-tile-major order (BwdParams::longest_first).
std::string attention_bwd_sm90(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& dout, const torch::Tensor& lse, const torch::Tensor& delta,
                               torch::Tensor& dq_accum, torch::Tensor& dk, torch::Tensor& dv, double scale, bool causal,
                               int64_t causal_offset, int64_t block_m, int64_t kv_split, bool longest_first,
                               int64_t stream) {
  Checker chk;
  tiled_attn::AttnDtype dtype;
  // check_attention_args with dout in its `out` slot: q's shape, dtype and device.
  if (!check_attention_args(chk, q, k, v, dout, lse, &dtype)) return chk.error();
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), seqlen_k = k.size(2);
  if (!(chk.value(tiled_attn::attention_bwd_sm90_head_dim_supported(head_dim), "head dim ", head_dim,
                  " is not instantiated in the wgmma attention backward") &&
        chk.value(delta.is_cuda() && delta.device() == q.device() && delta.scalar_type() == torch::kFloat &&
                      delta.sizes() == lse.sizes() && delta.is_contiguous(),
                  "delta must be a contiguous float32 tensor of lse's shape ", lse.sizes(), ", got ", delta.sizes()) &&
        chk.value(dq_accum.is_cuda() && dq_accum.device() == q.device() &&
                      dq_accum.scalar_type() == torch::kFloat && dq_accum.is_contiguous() &&
                      dq_accum.numel() == batch * heads_q * seqlen_q * head_dim,
                  "dq_accum must be a contiguous float32 tensor of B·Hq·Nq·D elements, got ", dq_accum.sizes()) &&
        (dk.scalar_type() == torch::kFloat && dv.scalar_type() == torch::kFloat
             ? chk.value(dk.is_cuda() && dk.device() == q.device() && dv.is_cuda() && dv.device() == q.device() &&
                             dk.dim() == 4 && dv.dim() == 4 && dk.stride(3) == 1 && dv.stride(3) == 1,
                         "float32 dk and dv must be 4-D (B, H, N, D) on ", q.device(),
                         " with a contiguous last dim")
             : check_attn_operand(chk, dk, "dk", q) && check_attn_operand(chk, dv, "dv", q)) &&
        chk.value(kv_split >= 1 && (heads_q / heads_kv) % kv_split == 0 &&
                      (kv_split == 1 || dk.scalar_type() == torch::kFloat),
                  "kv_split must be >= 1 and divide the GQA group ", heads_q / heads_kv,
                  " (above 1 with float32 dk and dv), got ", kv_split) &&
        chk.value(dk.dim() == 4 && dk.sizes() == dv.sizes() && dk.size(0) == batch &&
                      dk.size(1) == heads_kv * kv_split && dk.size(2) == seqlen_k && dk.size(3) == head_dim,
                  "dk and dv must have k's shape ", k.sizes(), " with ", kv_split, " times its heads, got ",
                  dk.sizes(), " and ", dv.sizes()))) {
    return chk.error();
  }
  if (!chk.value(seqlen_q > 0 && seqlen_k > 0 && batch > 0 && heads_q > 0,
                 "the wgmma attention backward needs Nq, Nk >= 1 (empty shapes have zero gradients)")) {
    return chk.error();
  }
  const DeviceGuard guard(q.get_device());
  check_launch(chk,
               tiled_attn::attention_bwd_sm90(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(),
                                              lse.data_ptr<float>(), delta.data_ptr<float>(),
                                              dq_accum.data_ptr<float>(), dk.data_ptr(), dv.data_ptr(), batch,
                                              heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, attn_strides(q),
                                              attn_strides(k), attn_strides(v), attn_strides(dout), attn_strides(dk),
                                              attn_strides(dv), static_cast<float>(scale), causal, causal_offset,
                                              block_m, dk.scalar_type() == torch::kFloat, kv_split,
                                              longest_first, as_stream(stream)),
               "CUDA wgmma attention backward kernel");
  return chk.error();
}
#endif  // TILED_ATTN_WITH_SM90
#endif

// ---- The C++ launch of a planned Triton kernel (tiled_attn/triton/launch.py, fast_spec; DESIGN §3 "Cost of
// a call") ----
// An eager ta.softmax of a tiny tensor costs the host its Python: in the H200 profile (host/2026-11-26-h200-
// profile-2.txt) Triton's C launcher took 3.95 µs (a 20-argument PyArg_ParseTuple, the GIL released and
// retaken), torch.empty_like 1.66 µs and our frames ~2.6 µs, against 5.9 µs for all of torch.softmax. Here one
// call allocates the output (at::empty_*, no Python argument parsing) and launches the kernel Triton compiled
// (its CUfunction, the parameters its launcher would pass) through cuLaunchKernel: the Python side keeps only
// the plan lookup. A plan is registered once, after its first launch through Triton; fast_run declines (returns
// None, nothing launched) whatever it cannot do exactly as that launch would, and the caller takes the Python path.
struct FastPlan {
  static constexpr const char* kCapsule = "tiled_attn.FastPlan";
  void* function = nullptr;  // CUfunction, loaded by Triton in `device`'s primary context
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 32;
  unsigned shared = 0;
  int device = 0;
  std::vector<unsigned char> params;  // the kernel's parameters, packed as Triton's launcher packs them
  std::vector<size_t> offsets;        // where each parameter starts in `params`
  int x_slot = -1, out_slot = -1;     // the parameters that take x's and the output's address
  std::vector<int64_t> out_sizes, out_strides;
  bool out_like_x = false;  // at::empty_like(x) gives exactly out_sizes / out_strides (cheaper)
  // A kernel of the CUDA softmax ladder instead (fast_register_softmax): its launcher, operands and
  // config as softmax_fwd would pass them, x's and y's addresses filled per call. `function` is unused.
  sm::ForwardLauncher softmax_launch = nullptr;
  sm::ForwardArgs softmax_args{};
  sm::LaunchConfig softmax_cfg{};
};

constexpr size_t kFastMaxParams = 32;
constexpr size_t kFastMaxBytes = 256;

using LaunchKernelFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                               void**, void**);

// cuLaunchKernel through the runtime's entry-point query, as flash_fwd_sm90_launch.cuh finds
// cuTensorMapEncodeTiled: the extension links the CUDA runtime only, never libcuda.
LaunchKernelFn launch_kernel_fn() {
  static const LaunchKernelFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<LaunchKernelFn>(p);
  }();
  return fn;
}

// A plan's capsule (named Plan::kCapsule) and its destructor.
template <class Plan>
void free_capsule(PyObject* capsule) {
  delete static_cast<Plan*>(PyCapsule_GetPointer(capsule, Plan::kCapsule));
}
template <class Plan>
Plan* from_capsule(PyObject* capsule) {  // null, with a Python error set, for anything else
  return static_cast<Plan*>(PyCapsule_GetPointer(capsule, Plan::kCapsule));
}

// (a capsule owning `plan`, freed with the Python object that holds it; error ('': none)).
template <class Plan>
std::tuple<py::object, std::string> as_capsule(std::unique_ptr<Plan> plan) {
  PyObject* capsule = PyCapsule_New(plan.get(), Plan::kCapsule, free_capsule<Plan>);
  if (capsule == nullptr) {
    PyErr_Clear();
    return {py::none(), "RuntimeError: a capsule for the plan could not be made"};
  }
  plan.release();
  return {py::reinterpret_steal<py::object>(capsule), ""};
}

// A capsule owning the plan (freed with the Python plan that holds it), or the error. `sizes`: each
// parameter's bytes (8 for a pointer; Triton packs an i32 in 4, i64 in 8, i1/i8 in 1, i16 in 2);
// `values`: the parameters' values (the x and out slots are filled per call).
std::tuple<py::object, std::string> fast_register(int64_t function, std::vector<int64_t> grid, int64_t threads,
                                                  int64_t shared, int64_t device, std::vector<int64_t> sizes,
                                                  std::vector<int64_t> values, int64_t x_slot, int64_t out_slot,
                                                  std::vector<int64_t> out_sizes, std::vector<int64_t> out_strides,
                                                  bool out_like_x) {
  Checker chk;
  const int64_t n = static_cast<int64_t>(sizes.size());
  if (!(chk.value(function != 0, "function must be a CUfunction handle, got 0") &&
        chk.value(grid.size() == 3 && grid[0] >= 1 && grid[1] >= 1 && grid[2] >= 1 && grid[0] <= 2147483647 &&
                      grid[1] < 65536 && grid[2] < 65536,
                  "grid must be 3 positive sizes within the launch limits") &&
        chk.value(threads >= 32 && threads <= 1024 && threads % 32 == 0, "threads must be a multiple of 32 in "
                  "[32, 1024], got ", threads) &&
        chk.value(shared >= 0, "shared must be >= 0, got ", shared) &&
        chk.value(values.size() == sizes.size(), "values and sizes must have one entry a parameter") &&
        chk.value(n <= static_cast<int64_t>(kFastMaxParams), "at most ", kFastMaxParams, " parameters, got ", n) &&
        chk.value(x_slot >= 0 && x_slot < n && out_slot >= 0 && out_slot < n && x_slot != out_slot,
                  "x_slot and out_slot must be two parameters") &&
        chk.value(out_sizes.size() == out_strides.size(), "out_sizes and out_strides must have one entry a dim") &&
        chk.runtime(launch_kernel_fn() != nullptr, "cuLaunchKernel was not found through the CUDA runtime"))) {
    return {py::none(), chk.error()};
  }
  auto plan = std::make_unique<FastPlan>();
  size_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bytes = sizes[i];
    if (!chk.value(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8, "parameter ", i,
                   " must be 1, 2, 4 or 8 bytes, got ", bytes)) {
      return {py::none(), chk.error()};
    }
    offset = (offset + bytes - 1) / bytes * bytes;  // each at its natural alignment
    plan->offsets.push_back(offset);
    offset += bytes;
  }
  if (!chk.value(offset <= kFastMaxBytes, "the parameters take ", offset, " bytes, more than ", kFastMaxBytes) ||
      !chk.value(sizes[x_slot] == 8 && sizes[out_slot] == 8, "the x and out parameters must be 8-byte pointers")) {
    return {py::none(), chk.error()};
  }
  plan->params.assign(offset, 0);
  for (int64_t i = 0; i < n; ++i) {  // little-endian: the low `bytes` of the value are the parameter
    std::memcpy(plan->params.data() + plan->offsets[i], &values[i], static_cast<size_t>(sizes[i]));
  }
  plan->function = reinterpret_cast<void*>(static_cast<intptr_t>(function));
  for (int i = 0; i < 3; ++i) plan->grid[i] = static_cast<unsigned>(grid[i]);
  plan->threads = static_cast<unsigned>(threads);
  plan->shared = static_cast<unsigned>(shared);
  plan->device = static_cast<int>(device);
  plan->x_slot = static_cast<int>(x_slot);
  plan->out_slot = static_cast<int>(out_slot);
  plan->out_sizes = std::move(out_sizes);
  plan->out_strides = std::move(out_strides);
  plan->out_like_x = out_like_x;
  return as_capsule(std::move(plan));
}

// The same capsule for a kernel of the CUDA softmax ladder (tiled_attn/cuda/softmax.py's plan): x2d / out2d
// are the plan's first call's (M, N) operands (their strides, dtype and alignment are every later call's: they
// are the plan's signature, and fast_run declines x off the 16-byte grid), the launch config as for softmax_fwd.
// Kernels that take a workspace (split_row) stay on the Python path.
std::tuple<py::object, std::string> fast_register_softmax(const std::string& kernel, const torch::Tensor& x2d,
                                                          const torch::Tensor& out2d, int64_t threads,
                                                          int64_t cluster, int64_t cta_bytes, int64_t chunk,
                                                          std::vector<int64_t> out_sizes,
                                                          std::vector<int64_t> out_strides, bool out_like_x) {
  Checker chk;
  sm::ForwardArgs a;
  sm::LaunchConfig cfg;
  const ForwardKernel* k = find_kernel(chk, kernel);
  if (!(k && forward_args(chk, x2d, out2d, &a) && launch_config(chk, threads, cluster, cta_bytes, chunk, &cfg) &&
        chk.value(kernel != "split_row", "kernel='split_row' needs a workspace: it stays on the Python path") &&
        chk.value(a.rows > 0 && a.cols > 0, "x2d must not be empty") &&
        chk.value(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0,
                  "x2d and out2d must be 16-byte aligned (the alignment every fast_run call has)") &&
        chk.value(out_sizes.size() == out_strides.size(), "out_sizes and out_strides must have one entry a dim"))) {
    return {py::none(), chk.error()};
  }
  const int device = x2d.get_device();
  const int64_t limit = max_cols(kernel, a, cfg, device);
  if (!chk.value(limit < 0 || a.cols <= limit, "kernel='", kernel, "' takes rows of at most ", limit,
                 " columns here, got ", a.cols)) {
    return {py::none(), chk.error()};
  }
  auto plan = std::make_unique<FastPlan>();
  plan->softmax_launch = k->launch;
  plan->softmax_args = a;
  plan->softmax_args.x = nullptr;  // per call
  plan->softmax_args.y = nullptr;
  plan->softmax_cfg = cfg;
  plan->device = device;
  plan->out_sizes = std::move(out_sizes);
  plan->out_strides = std::move(out_strides);
  plan->out_like_x = out_like_x;
  return as_capsule(std::move(plan));
}

// fast_run(plan, x, stream, poison) -> the output, or None where the Python path must run the call instead:
// x is not a plain CUDA tensor on the plan's device, that device is not current (Triton's function belongs to
// its context), x's address is off the 16-byte grid (another specialization of the kernel), or the allocation
// failed (the Python path raises it). A failed launch raises RuntimeError. A METH_FASTCALL function, not a
// pybind11 one: its argument casting costs about a microsecond a call.
PyObject* fast_run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "fast_run(plan, x, stream, poison) takes 4 arguments");
    return nullptr;
  }
  auto* plan = from_capsule<FastPlan>(args[0]);
  if (plan == nullptr) return nullptr;
  if (!THPVariable_CheckExact(args[1])) Py_RETURN_NONE;
  const at::Tensor& x = THPVariable_Unpack(args[1]);
  const unsigned long long stream = PyLong_AsUnsignedLongLong(args[2]);
  if (stream == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  const int poison = PyObject_IsTrue(args[3]);
  if (poison < 0) return nullptr;
  int current = -1;
  if (!x.is_cuda() || x.get_device() != plan->device || cudaGetDevice(&current) != cudaSuccess ||
      current != plan->device) {
    Py_RETURN_NONE;
  }
  const auto x_address = reinterpret_cast<uintptr_t>(x.data_ptr());
  if (x_address % 16 != 0) Py_RETURN_NONE;
  at::Tensor out;
  try {
    out = plan->out_like_x ? at::empty_like(x) : at::empty_strided(plan->out_sizes, plan->out_strides, x.options());
    if (poison) out.fill_(std::numeric_limits<double>::quiet_NaN());
  } catch (const std::exception&) {
    Py_RETURN_NONE;
  }
  if (plan->softmax_launch != nullptr) {
    sm::ForwardArgs a = plan->softmax_args;
    a.x = x.data_ptr();
    a.y = out.data_ptr();
    const cudaError_t err = plan->softmax_launch(a, plan->softmax_cfg, nullptr,
                                                 reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
    if (err != cudaSuccess) {
      const std::string msg = std::string("CUDA softmax kernel launch failed: ") + cudaGetErrorName(err) + " (" +
                              cudaGetErrorString(err) + ")";
      PyErr_SetString(PyExc_RuntimeError, msg.c_str());
      return nullptr;
    }
    return THPVariable_Wrap(std::move(out));
  }
  alignas(16) unsigned char params[kFastMaxBytes];
  void* slots[kFastMaxParams];
  std::memcpy(params, plan->params.data(), plan->params.size());
  const uint64_t x_ptr = x_address, out_ptr = reinterpret_cast<uintptr_t>(out.data_ptr());
  std::memcpy(params + plan->offsets[plan->x_slot], &x_ptr, 8);
  std::memcpy(params + plan->offsets[plan->out_slot], &out_ptr, 8);
  for (size_t i = 0; i < plan->offsets.size(); ++i) slots[i] = params + plan->offsets[i];
  const int err = launch_kernel_fn()(plan->function, plan->grid[0], plan->grid[1], plan->grid[2], plan->threads, 1,
                                     1, plan->shared, reinterpret_cast<void*>(static_cast<uintptr_t>(stream)), slots,
                                     nullptr);
  if (err == 201) Py_RETURN_NONE;  // CUDA_ERROR_INVALID_CONTEXT: no context current on this thread yet
  if (err != 0) {
    const std::string msg = "cuLaunchKernel of a planned Triton kernel failed with CUresult " + std::to_string(err);
    PyErr_SetString(PyExc_RuntimeError, msg.c_str());
    return nullptr;
  }
  return THPVariable_Wrap(std::move(out));
}

PyMethodDef kFastRunDef = {"fast_run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_run)),
                           METH_FASTCALL,
                           "fast_run(plan, x, stream, poison): allocate the output and launch a registered plan; "
                           "None where the caller must take the Python path"};

#if TILED_ATTN_WITH_ATTENTION
// ---- The C++ path of a planned attention backward (tiled_attn/cuda/attention_backward.py, the wgmma kernel's;
// tiled_attn/triton/attention_backward.py, the Triton kernels') ----
// The Python run of one wgmma backward cost the host ~47 µs (H200, benchmarks/probe_autograd_host.py: five
// allocations, two Triton launches through Python, the binding's argument parsing), and ~77 µs on the autograd
// engine's thread, where it runs in training; torch's own SDPA backward is one C++ node. Here one METH_FASTCALL
// call allocates the gradients and workspaces and launches what the Python run launches, in its order: Triton
// kernels (delta, which zeroes a dQ accumulator; the Triton dK/dV and dQ kernels or the dQ store / finish), and
// where the plan has it, the wgmma kernel at its place among them; from a plan registered after the signature's
// first Python call.
// Table of a call's tensors: the six inputs, then the plan's allocations in registration order.
constexpr int kBwdInputs = 6;  // q, k, v, out, lse, grad_out
constexpr int kBwdMaxTable = 16;
// The Triton dK/dV kernel takes 37 parameters (9 addresses, 18 strides, 8 scalars, Triton's 2 scratch
// pointers), about 200 bytes: more than a softmax kernel's fast_run limits.
constexpr size_t kPackedMaxParams = 64;
constexpr size_t kPackedMaxBytes = 512;

struct PackedKernel {  // a planned Triton launch (as fast_register takes it), its tensors filled per call
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 32, shared = 0;
  std::vector<unsigned char> params;
  std::vector<size_t> offsets;
  std::vector<std::pair<size_t, int>> tensors;  // (parameter, table entry)
};

#if TILED_ATTN_WITH_SM90
// The wgmma kernel's arguments but its addresses: lse, grad_out, q, k, v are inputs, delta and the dQ
// accumulator table entries, dk and dv table entries (+ a byte offset: the two halves of one float32 partials
// buffer under a split).
struct WgmmaStep {
  tiled_attn::AttnDtype dtype = tiled_attn::AttnDtype::kFloat16;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  tiled_attn::AttnStrides q_s{}, k_s{}, v_s{}, do_s{}, dk_s{}, dv_s{};
  float scale = 1.f;
  bool causal = false, dkv_f32 = false, longest_first = false;
  int64_t causal_offset = 0, block_m = 64, kv_split = 1;
  int ws = 0, acc = 0, dk = 0, dv = 0;
  int64_t dv_offset = 0;
};
#endif

struct BwdFastPlan {
  static constexpr const char* kCapsule = "tiled_attn.BwdFastPlan";
  int device = 0;
  std::vector<std::vector<int64_t>> alloc_sizes, alloc_strides;
  std::vector<at::ScalarType> alloc_dtypes;
  int grads[3] = {0, 0, 0};  // the table entries returned as (dq, dk, dv)
  std::vector<PackedKernel> kernels;
  int wgmma_at = -1;  // the wgmma kernel runs before kernels[wgmma_at]; -1: no wgmma step
#if TILED_ATTN_WITH_SM90
  WgmmaStep wgmma;
#endif
};

using KernelSpec = std::tuple<int64_t, std::vector<int64_t>, int64_t, int64_t, std::vector<int64_t>,
                              std::vector<int64_t>, std::vector<int64_t>>;

// spec: (function, grid, threads, shared, sizes, values, entries): Bound.fast_spec's launch with, for each
// parameter, the table entry whose address it takes (-1: the packed value).
bool pack_kernel(Checker& chk, size_t index, const KernelSpec& spec, int table_size, PackedKernel* k) {
  const auto& [function, grid, threads, shared, sizes, values, entries] = spec;
  const size_t n = sizes.size();
  if (!(chk.value(function != 0, "kernel ", index, ": function must be a CUfunction handle") &&
        chk.value(grid.size() == 3 && grid[0] >= 1 && grid[1] >= 1 && grid[2] >= 1 && grid[0] <= 2147483647 &&
                      grid[1] < 65536 && grid[2] < 65536,
                  "kernel ", index, ": grid must be 3 positive sizes within the launch limits") &&
        chk.value(threads >= 32 && threads <= 1024 && threads % 32 == 0, "kernel ", index,
                  ": threads must be a multiple of 32") &&
        chk.value(shared >= 0, "kernel ", index, ": shared must be >= 0") &&
        chk.value(values.size() == n && entries.size() == n, "kernel ", index,
                  ": one value and one entry a parameter") &&
        chk.value(n <= kPackedMaxParams, "kernel ", index, ": at most ", kPackedMaxParams, " parameters"))) {
    return false;
  }
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t bytes = sizes[i];
    if (!chk.value(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8, "kernel ", index, ": parameter ", i,
                   " must be 1, 2, 4 or 8 bytes") ||
        !chk.value(entries[i] < table_size && (entries[i] < 0 || bytes == 8), "kernel ", index, ": parameter ", i,
                   " takes table entry ", entries[i], " (", table_size, " entries; addresses are 8 bytes)")) {
      return false;
    }
    offset = (offset + bytes - 1) / bytes * bytes;
    k->offsets.push_back(offset);
    if (entries[i] >= 0) k->tensors.emplace_back(i, static_cast<int>(entries[i]));
    offset += bytes;
  }
  if (!chk.value(offset <= kPackedMaxBytes, "kernel ", index, ": the parameters take more than ", kPackedMaxBytes,
                 " bytes")) {
    return false;
  }
  k->params.assign(offset, 0);
  for (size_t i = 0; i < n; ++i) std::memcpy(k->params.data() + k->offsets[i], &values[i], sizes[i]);
  k->function = reinterpret_cast<void*>(static_cast<intptr_t>(function));
  for (int i = 0; i < 3; ++i) k->grid[i] = static_cast<unsigned>(grid[i]);
  k->threads = static_cast<unsigned>(threads);
  k->shared = static_cast<unsigned>(shared);
  return true;
}

// The CUresult of the launch (0: launched).
int launch_packed(const PackedKernel& k, const uint64_t* addresses, cudaStream_t stream) {
  alignas(16) unsigned char params[kPackedMaxBytes];
  void* slots[kPackedMaxParams];
  std::memcpy(params, k.params.data(), k.params.size());
  for (const auto& [param, entry] : k.tensors) std::memcpy(params + k.offsets[param], &addresses[entry], 8);
  for (size_t i = 0; i < k.offsets.size(); ++i) slots[i] = params + k.offsets[i];
  return launch_kernel_fn()(k.function, k.grid[0], k.grid[1], k.grid[2], k.threads, 1, 1, k.shared, stream, slots,
                            nullptr);
}

// A capsule owning the plan, or the error. `inputs`: the first call's q, k, v, out, lse, grad_out; `allocs`:
// the tensors that call allocated (their sizes, strides and dtypes are every call's); `grads`: the table entries
// returned as (dq, dk, dv); `kernels`: the Triton launches in order; `wgmma`: None, or the wgmma step
// (at, ws, acc, dk, dv, dv_offset, dk_like, dv_like, scale, causal, causal_offset, block_m, kv_split,
// longest_first): it runs before kernels[at]; ws, acc, dk and dv are table entries (dv at `dv_offset` bytes into
// its entry) and dk_like / dv_like those operands as the kernel takes them (4-D views: strides and dtype).
std::tuple<py::object, std::string> attention_bwd_fast_register(std::vector<torch::Tensor> inputs,
                                                                std::vector<torch::Tensor> allocs,
                                                                std::vector<int64_t> grads,
                                                                std::vector<KernelSpec> kernels,
                                                                const py::object& wgmma) {
  Checker chk;
  const int table = kBwdInputs + static_cast<int>(allocs.size());
  auto entry_ok = [&](int64_t e) { return e >= 0 && e < table; };
  if (!(chk.value(inputs.size() == kBwdInputs, "inputs must be q, k, v, out, lse, grad_out") &&
        chk.value(table <= kBwdMaxTable, "at most ", kBwdMaxTable - kBwdInputs, " allocations") &&
        chk.value(grads.size() == 3 && entry_ok(grads[0]) && entry_ok(grads[1]) && entry_ok(grads[2]),
                  "grads must be three table entries") &&
        chk.runtime(launch_kernel_fn() != nullptr, "cuLaunchKernel was not found through the CUDA runtime"))) {
    return {py::none(), chk.error()};
  }
  std::vector<torch::Tensor> all(inputs);
  all.insert(all.end(), allocs.begin(), allocs.end());
  const torch::Tensor& q = all[0];
  for (const auto& t : all) {
    if (!chk.value(t.is_cuda() && t.device() == q.device() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
                   "every tensor must be on ", q.device(), " and 16-byte aligned (the alignment every call has)")) {
      return {py::none(), chk.error()};
    }
  }
  auto plan = std::make_unique<BwdFastPlan>();
  plan->kernels.resize(kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!pack_kernel(chk, i, kernels[i], table, &plan->kernels[i])) return {py::none(), chk.error()};
  }
  if (!wgmma.is_none()) {
#if TILED_ATTN_WITH_SM90
    const auto w = wgmma.cast<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, torch::Tensor,
                                         torch::Tensor, double, bool, int64_t, int64_t, int64_t, bool>>();
    const auto& [place, ws, acc, dk, dv, dv_offset, dkt, dvt, scale, causal, causal_offset, block_m, kv_split,
                 longest_first] = w;
    const torch::Tensor &k = all[1], &dout = all[5];
    if (!(chk.value(place >= 0 && place <= static_cast<int64_t>(kernels.size()), "the wgmma step's place ", place,
                    " must be within the ", kernels.size(), " kernels") &&
          chk.value(entry_ok(ws) && entry_ok(acc) && entry_ok(dk) && entry_ok(dv) && dv_offset >= 0,
                    "the wgmma step's ws, acc, dk and dv must be table entries") &&
          chk.value(q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16,
                    "the wgmma step takes fp16 or bf16 q") &&
          chk.value(q.dim() == 4 && k.dim() == 4 && dkt.dim() == 4 && dvt.dim() == 4,
                    "q, k, dk_like and dv_like must be 4-D") &&
          chk.value(dkt.data_ptr() == all[dk].data_ptr() &&
                        static_cast<const char*>(dvt.data_ptr()) ==
                            static_cast<const char*>(all[dv].data_ptr()) + dv_offset &&
                        dkt.scalar_type() == dvt.scalar_type(),
                    "dk_like and dv_like must be views of table entries dk and dv (dv at dv_offset bytes), one "
                    "dtype"))) {
      return {py::none(), chk.error()};
    }
    WgmmaStep& s = plan->wgmma;
    plan->wgmma_at = static_cast<int>(place);
    s.dtype = q.scalar_type() == torch::kHalf ? tiled_attn::AttnDtype::kFloat16 : tiled_attn::AttnDtype::kBFloat16;
    s.batch = q.size(0), s.heads_q = q.size(1), s.seqlen_q = q.size(2), s.head_dim = q.size(3);
    s.heads_kv = k.size(1), s.seqlen_k = k.size(2);
    s.q_s = attn_strides(q), s.k_s = attn_strides(k), s.v_s = attn_strides(all[2]);
    s.do_s = attn_strides(dout), s.dk_s = attn_strides(dkt), s.dv_s = attn_strides(dvt);
    s.scale = static_cast<float>(scale);
    s.causal = causal, s.causal_offset = causal_offset, s.block_m = block_m;
    s.kv_split = kv_split, s.longest_first = longest_first;
    s.dkv_f32 = dkt.scalar_type() == torch::kFloat;
    s.ws = static_cast<int>(ws), s.acc = static_cast<int>(acc);
    s.dk = static_cast<int>(dk), s.dv = static_cast<int>(dv), s.dv_offset = dv_offset;
#else
    return {py::none(), "the extension has no wgmma backward (built without sm90)"};
#endif
  }
  plan->device = q.get_device();
  for (const auto& t : allocs) {
    plan->alloc_sizes.push_back(t.sizes().vec());
    plan->alloc_strides.push_back(t.strides().vec());
    plan->alloc_dtypes.push_back(t.scalar_type());
  }
  for (int i = 0; i < 3; ++i) plan->grads[i] = static_cast<int>(grads[i]);
  return as_capsule(std::move(plan));
}

PyObject* raise_launch(const char* what, long code) {
  const std::string msg = std::string(what) + " failed with error " + std::to_string(code);
  PyErr_SetString(PyExc_RuntimeError, msg.c_str());
  return nullptr;
}

#if TILED_ATTN_WITH_SM90
cudaError_t run_wgmma_step(const WgmmaStep& s, const at::Tensor* table, cudaStream_t stream) {
  return tiled_attn::attention_bwd_sm90(
      s.dtype, table[0].data_ptr(), table[1].data_ptr(), table[2].data_ptr(), table[5].data_ptr(),
      static_cast<const float*>(table[4].data_ptr()), static_cast<const float*>(table[s.ws].data_ptr()),
      static_cast<float*>(table[s.acc].data_ptr()), table[s.dk].data_ptr(),
      static_cast<unsigned char*>(table[s.dv].data_ptr()) + s.dv_offset, s.batch, s.heads_q, s.heads_kv, s.seqlen_q,
      s.seqlen_k, s.head_dim, s.q_s, s.k_s, s.v_s, s.do_s, s.dk_s, s.dv_s, s.scale, s.causal, s.causal_offset,
      s.block_m, s.dkv_f32, s.kv_split, s.longest_first, stream);
}
#endif

// attention_bwd_fast(plan, q, k, v, out, lse, grad_out, stream, poison) -> (dq, dk, dv), or None where the
// Python path must run the call (no kernel of the plan launched): an input not a plain CUDA tensor on the plan's
// device, off the 16-byte grid (the Python run copies such an operand for the wgmma kernel; the Triton kernels
// were registered aligned), that device not current, an allocation failed, or no CUDA context on this thread
// yet (found at the first launch: with poison, the NaN fills of the gradients it then drops are queued by
// then). A launch that fails after the first raises RuntimeError (the Python path would fail the same way).
PyObject* attention_bwd_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError,
                    "attention_bwd_fast(plan, q, k, v, out, lse, grad_out, stream, poison) takes 9 arguments");
    return nullptr;
  }
  auto* plan = from_capsule<BwdFastPlan>(args[0]);
  if (plan == nullptr) return nullptr;
  at::Tensor table[kBwdMaxTable];
  uint64_t addr[kBwdMaxTable] = {};
  for (int i = 0; i < kBwdInputs; ++i) {
    if (!THPVariable_CheckExact(args[1 + i])) Py_RETURN_NONE;
    const at::Tensor& t = THPVariable_Unpack(args[1 + i]);
    if (!t.is_cuda() || t.get_device() != plan->device) Py_RETURN_NONE;
    addr[i] = reinterpret_cast<uintptr_t>(t.data_ptr());
    if (addr[i] % 16 != 0) Py_RETURN_NONE;
    table[i] = t;
  }
  const unsigned long long stream_id = PyLong_AsUnsignedLongLong(args[7]);
  if (stream_id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  const int poison = PyObject_IsTrue(args[8]);
  if (poison < 0) return nullptr;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != plan->device) Py_RETURN_NONE;
  const auto stream = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream_id));
  try {
    for (size_t j = 0; j < plan->alloc_sizes.size(); ++j) {
      const int e = kBwdInputs + static_cast<int>(j);
      table[e] = at::empty_strided(plan->alloc_sizes[j], plan->alloc_strides[j],
                                   at::TensorOptions().dtype(plan->alloc_dtypes[j]).device(at::kCUDA, plan->device));
      addr[e] = reinterpret_cast<uintptr_t>(table[e].data_ptr());
    }
    if (poison) {
      for (int g : plan->grads) table[g].fill_(std::numeric_limits<double>::quiet_NaN());
    }
  } catch (const std::exception&) {
    Py_RETURN_NONE;
  }
  const int steps = static_cast<int>(plan->kernels.size());
  for (int i = 0; i <= steps; ++i) {
#if TILED_ATTN_WITH_SM90
    if (i == plan->wgmma_at) {
      const cudaError_t err = run_wgmma_step(plan->wgmma, table, stream);
      if (err != cudaSuccess) {
        const std::string msg = std::string("CUDA wgmma attention backward kernel: ") + cudaGetErrorName(err) +
                                " (" + cudaGetErrorString(err) + ")";
        PyErr_SetString(PyExc_RuntimeError, msg.c_str());
        return nullptr;
      }
    }
#endif
    if (i == steps) break;
    const int err = launch_packed(plan->kernels[i], addr, stream);
    if (err == 201 && i == 0) Py_RETURN_NONE;  // CUDA_ERROR_INVALID_CONTEXT: no context on this thread yet
    if (err != 0) return raise_launch("cuLaunchKernel of a planned attention backward kernel", err);
  }
  PyObject* result = PyTuple_New(3);
  if (result == nullptr) return nullptr;
  for (int i = 0; i < 3; ++i) {
    PyObject* grad = THPVariable_Wrap(table[plan->grads[i]]);
    if (grad == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, i, grad);
  }
  return result;
}

PyMethodDef kAttentionBwdFastDef = {
    "attention_bwd_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(attention_bwd_fast)),
    METH_FASTCALL,
    "attention_bwd_fast(plan, q, k, v, out, lse, grad_out, stream, poison): allocate the gradients and launch a "
    "registered attention backward; None where the caller must take the Python path"};
#endif  // TILED_ATTN_WITH_ATTENTION


}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tiled_attn CUDA kernels (csrc/): the softmax ladder, its fused backward, the attention forward";
  m.def("softmax_fwd", &softmax_fwd,
        "softmax of each row of x (2-D, any strides) into row-major out; returns the error ('': none)",
        py::arg("kernel"), py::arg("x"), py::arg("out"), py::arg("threads"), py::arg("cluster"),
        py::arg("cta_bytes"), py::arg("chunk"), py::arg("stream"));
  m.def("softmax_max_cols", &softmax_max_cols,
        "(longest row a kernel takes for these operands (-1: any), error ('': none))", py::arg("kernel"),
        py::arg("x"), py::arg("out"), py::arg("threads"), py::arg("cluster"), py::arg("cta_bytes"), py::arg("chunk"));
  m.def("softmax_bwd", &softmax_bwd, "dx = y * (dy - sum(dy * y)) row by row; returns the error ('': none)",
        py::arg("y"), py::arg("dy"), py::arg("dx"), py::arg("threads"), py::arg("chunk"), py::arg("stream"));
  m.def("_raise_for_test", &raise_for_test, "throw a C++ exception of `kind` ('std' or 'c10'): a test hook",
        py::arg("kind"));
  m.def("fast_register", &fast_register,
        "(a capsule owning a planned Triton launch for fast_run, error ('': none))", py::arg("function"),
        py::arg("grid"), py::arg("threads"), py::arg("shared"), py::arg("device"), py::arg("sizes"), py::arg("values"),
        py::arg("x_slot"), py::arg("out_slot"), py::arg("out_sizes"), py::arg("out_strides"), py::arg("out_like_x"));
  m.def("fast_register_softmax", &fast_register_softmax,
        "(a capsule owning a planned CUDA softmax launch for fast_run, error ('': none))", py::arg("kernel"),
        py::arg("x2d"), py::arg("out2d"), py::arg("threads"), py::arg("cluster"), py::arg("cta_bytes"),
        py::arg("chunk"), py::arg("out_sizes"), py::arg("out_strides"), py::arg("out_like_x"));
  m.add_object("fast_run", py::reinterpret_steal<py::object>(PyCFunction_New(&kFastRunDef, nullptr)));
  m.def("softmax_kernels", [] {
    std::vector<std::string> names;
    for (const auto& k : kForwardKernels) names.emplace_back(k.name);
    return names;
  });
#if TILED_ATTN_WITH_ATTENTION
  m.def("attention_fwd", &attention_fwd, "fused attention forward into out and lse; returns the error ('': none)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("scale"), py::arg("causal"),
        py::arg("causal_offset"), py::arg("stream"));
  m.def("attention_fwd_split", &attention_fwd_split,
        "split-KV attention forward (key splits, GQA rows packed, partials merged) into out and lse; returns the "
        "error ('': none)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("workspace"),
        py::arg("num_splits"), py::arg("scale"), py::arg("causal"), py::arg("causal_offset"), py::arg("stream"));
  m.def("attention_head_dim_supported", &tiled_attn::attention_head_dim_supported, py::arg("head_dim"));
  m.def("attention_bwd_fast_register", &attention_bwd_fast_register,
        "(a capsule owning a planned attention backward for attention_bwd_fast, error ('': none))",
        py::arg("inputs"), py::arg("allocs"), py::arg("grads"), py::arg("kernels"), py::arg("wgmma"));
  m.add_object("attention_bwd_fast",
               py::reinterpret_steal<py::object>(PyCFunction_New(&kAttentionBwdFastDef, nullptr)));
  m.attr("has_attention") = true;
#if TILED_ATTN_WITH_SM90  // ---- wgmma attention forward ----
  m.def("attention_fwd_sm90", &attention_fwd_sm90,
        "attention forward with the sm_90a wgmma kernel into out and lse; returns the error ('': none)", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("scale"), py::arg("causal"),
        py::arg("causal_offset"), py::arg("stream"), py::arg("warp_specialized") = false);
  m.def("attention_sm90_head_dim_supported", &tiled_attn::attention_sm90_head_dim_supported, py::arg("head_dim"),
        py::arg("warp_specialized") = false);
  m.def("attention_bwd_sm90", &attention_bwd_sm90,
        "attention backward with the sm_90a wgmma kernel: dq_accum += dS k, dk and dv written; returns the error "
        "('': none)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"), py::arg("lse"), py::arg("delta"),
        py::arg("dq_accum"), py::arg("dk"), py::arg("dv"), py::arg("scale"), py::arg("causal"),
        py::arg("causal_offset"), py::arg("block_m"), py::arg("kv_split"),
        py::arg("longest_first"), py::arg("stream"));
  m.def("attention_bwd_sm90_head_dim_supported", &tiled_attn::attention_bwd_sm90_head_dim_supported,
        py::arg("head_dim"));
  m.attr("has_attention_sm90") = true;
#else
  m.attr("has_attention_sm90") = false;
#endif
#else
  m.attr("has_attention") = false;
  m.attr("has_attention_sm90") = false;  // wgmma attention forward
#endif
}
