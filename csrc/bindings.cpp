// bindings.cpp: the only file that includes torch headers (DESIGN §2). It turns tensors into raw
// pointers, int64 sizes and strides, the launch config into LaunchConfig and the stream (an int:
// torch.cuda.current_stream().cuda_stream) into a cudaStream_t, calls the launchers of
// csrc/softmax/ and csrc/attention/, and raises their errors as Python exceptions (RuntimeError for a
// CUDA error, ValueError/TypeError for operands a kernel cannot take, before anything launches).
// Only torch/extension.h is used (no ATen/cuda, c10/cuda headers), so this compiles against a CPU
// torch wheel too; the device guard below is plain CUDA runtime.
#include <torch/extension.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "softmax/softmax.h"
#if TILED_ATTN_WITH_ATTENTION
#include "attention/attention.h"
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

void check_launch(cudaError_t err, const std::string& what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

sm::Dtype softmax_dtype(const torch::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case torch::kFloat: return sm::Dtype::kFloat32;
    case torch::kHalf: return sm::Dtype::kFloat16;
    case torch::kBFloat16: return sm::Dtype::kBFloat16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  return sm::Dtype::kFloat32;
}

void check_matrix(const torch::Tensor& t, const char* name, const torch::Tensor& like, bool row_major) {
  TORCH_CHECK_VALUE(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK_VALUE(t.dim() == 2, name, " must be 2-D (rows, cols), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.sizes() == like.sizes(), name, " must have shape ", like.sizes(), ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " must be on ", like.device(), ", got ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), name, " must have dtype ", like.scalar_type(), ", got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(!row_major || t.size(1) <= 1 || t.stride(1) == 1, name,
                    " must be row-major (column stride 1), got strides ", t.strides());
}

sm::LaunchConfig launch_config(int64_t threads, int64_t cluster, int64_t cta_bytes, int64_t chunk) {
  TORCH_CHECK_VALUE(threads >= 32 && threads <= sm::kMaxThreads && threads % 32 == 0,
                    "threads must be a multiple of 32 in [32, ", sm::kMaxThreads, "], got ", threads);
  TORCH_CHECK_VALUE(cluster >= 1 && cluster <= sm::kMaxCluster, "cluster must be in [1, ", sm::kMaxCluster,
                    "], got ", cluster);
  sm::LaunchConfig cfg;
  cfg.threads = static_cast<int>(threads);
  cfg.cluster = static_cast<int>(cluster);
  cfg.cta_bytes = cta_bytes;
  cfg.chunk = chunk;
  return cfg;
}

sm::ForwardArgs forward_args(const torch::Tensor& x, const torch::Tensor& out) {
  check_matrix(x, "x", x, false);
  check_matrix(out, "out", x, true);
  sm::ForwardArgs a;
  a.dtype = softmax_dtype(x, "x");
  a.x = x.data_ptr();
  a.x_row_stride = x.stride(0);
  a.x_col_stride = x.stride(1);
  a.y = out.data_ptr();
  a.y_row_stride = out.stride(0);
  a.rows = x.size(0);
  a.cols = x.size(1);
  return a;
}

using sm::ForwardKernel;
using sm::kForwardKernels;

const ForwardKernel& find_kernel(const std::string& name) {
  std::string known;
  for (const auto& k : kForwardKernels) {
    if (name == k.name) return k;
    known += known.empty() ? "" : ", ";
    known += k.name;
  }
  TORCH_CHECK_VALUE(false, "kernel must be one of ", known, ", got '", name, "'");
  return kForwardKernels[0];
}

// The longest row the kernel takes for these operands on x's device; -1: any.
int64_t max_cols(const std::string& kernel, const sm::ForwardArgs& a, const sm::LaunchConfig& cfg, int device) {
  if (kernel == "block_row_reg") return sm::forward_block_row_reg_max_cols(a);
  if (kernel == "block_row_smem") return sm::forward_block_row_smem_max_cols(a, cfg, device);
  return -1;
}

int64_t softmax_max_cols(const std::string& kernel, const torch::Tensor& x, const torch::Tensor& out,
                         int64_t threads, int64_t cluster, int64_t cta_bytes, int64_t chunk) {
  find_kernel(kernel);
  const sm::ForwardArgs a = forward_args(x, out);
  return max_cols(kernel, a, launch_config(threads, cluster, cta_bytes, chunk), x.get_device());
}

void softmax_fwd(const std::string& kernel, const torch::Tensor& x, torch::Tensor& out, int64_t threads,
                 int64_t cluster, int64_t cta_bytes, int64_t chunk, int64_t stream) {
  const ForwardKernel& k = find_kernel(kernel);
  const sm::ForwardArgs a = forward_args(x, out);
  const sm::LaunchConfig cfg = launch_config(threads, cluster, cta_bytes, chunk);
  if (a.rows == 0 || a.cols == 0) return;
  const int device = x.get_device();
  const DeviceGuard guard(device);
  const int64_t limit = max_cols(kernel, a, cfg, device);
  TORCH_CHECK_VALUE(limit < 0 || a.cols <= limit, "kernel='", kernel, "' takes rows of at most ", limit,
                    " columns for this dtype and layout on this device, got ", a.cols,
                    " (kernel='split_row' or kernel=None take any length)");
  torch::Tensor workspace;
  const int64_t ws_bytes = kernel == "split_row" ? sm::forward_split_row_workspace_bytes(a, cfg) : 0;
  if (ws_bytes > 0) workspace = torch::empty({ws_bytes}, x.options().dtype(torch::kUInt8));
  check_launch(k.launch(a, cfg, ws_bytes > 0 ? workspace.data_ptr() : nullptr, as_stream(stream)),
               "CUDA softmax kernel '" + kernel + "'");
}

void softmax_bwd(const torch::Tensor& y, const torch::Tensor& dy, torch::Tensor& dx, int64_t threads, int64_t chunk,
                 int64_t stream) {
  check_matrix(y, "y", y, false);
  check_matrix(dy, "dy", y, false);
  check_matrix(dx, "dx", y, true);
  sm::BackwardArgs a;
  a.dtype = softmax_dtype(y, "y");
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
  const sm::LaunchConfig cfg = launch_config(threads, 1, 0, chunk);
  if (a.rows == 0 || a.cols == 0) return;
  const DeviceGuard guard(y.get_device());
  torch::Tensor workspace;
  const int64_t ws_bytes = sm::backward_workspace_bytes(a, cfg);
  if (ws_bytes > 0) workspace = torch::empty({ws_bytes}, y.options().dtype(torch::kUInt8));
  check_launch(sm::backward(a, cfg, ws_bytes > 0 ? workspace.data_ptr() : nullptr, as_stream(stream)),
               "CUDA softmax backward");
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

void check_attn_operand(const torch::Tensor& t, const char* name, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == q.device(), name, " must be on ", q.device(), ", got ", t.device());
  TORCH_CHECK_VALUE(t.dim() == 4, name, " must have 4 dims (B, H, N, D), got shape ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), name, " must have q's dtype ", q.scalar_type(), ", got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.size(3) <= 1 || t.stride(3) == 1, name, " must have a contiguous last dim, got strides ",
                    t.strides());
}

void attention_fwd(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& out,
                   torch::Tensor& lse, double scale, bool causal, int64_t causal_offset, int64_t stream) {
  TORCH_CHECK_VALUE(q.is_cuda(), "q must be a CUDA tensor, got one on ", q.device());
  tiled_attn::AttnDtype dtype;
  if (q.scalar_type() == torch::kHalf) {
    dtype = tiled_attn::AttnDtype::kFloat16;
  } else if (q.scalar_type() == torch::kBFloat16) {
    dtype = tiled_attn::AttnDtype::kBFloat16;
  } else {
    TORCH_CHECK_TYPE(false, "the CUDA attention kernel takes float16 or bfloat16, got ", q.scalar_type());
  }
  check_attn_operand(q, "q", q);
  check_attn_operand(k, "k", q);
  check_attn_operand(v, "v", q);
  check_attn_operand(out, "out", q);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "k and v must have the same shape, got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(out.sizes() == q.sizes(), "out must have q's shape ", q.sizes(), ", got ", out.sizes());
  const int64_t batch = q.size(0), heads_q = q.size(1), seqlen_q = q.size(2), head_dim = q.size(3);
  const int64_t heads_kv = k.size(1), seqlen_k = k.size(2);
  TORCH_CHECK_VALUE(k.size(0) == batch && k.size(3) == head_dim, "k must be (", batch, ", Hkv, Nk, ", head_dim,
                    "), got ", k.sizes());
  TORCH_CHECK_VALUE(heads_kv > 0 && heads_q % heads_kv == 0, "q's heads (", heads_q,
                    ") must be a multiple of k/v's heads (", heads_kv, ")");
  TORCH_CHECK_VALUE(tiled_attn::attention_head_dim_supported(head_dim), "head dim ", head_dim,
                    " is not instantiated in the CUDA attention kernel");
  TORCH_CHECK_VALUE(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == torch::kFloat &&
                        lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads_q &&
                        lse.size(2) == seqlen_q && lse.is_contiguous(),
                    "lse must be a contiguous float32 (B, Hq, Nq) tensor on q's device, got ", lse.sizes(), " ",
                    lse.scalar_type());
  if (q.numel() == 0) return;
  const DeviceGuard guard(q.get_device());
  check_launch(tiled_attn::attention_fwd(dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                         lse.data_ptr<float>(), batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                         head_dim, attn_strides(q), attn_strides(k), attn_strides(v),
                                         attn_strides(out), static_cast<float>(scale), causal, causal_offset,
                                         as_stream(stream)),
               "CUDA attention kernel");
}
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tiled_attn CUDA kernels (csrc/): the softmax ladder, its fused backward, the attention forward";
  m.def("softmax_fwd", &softmax_fwd, "softmax of each row of x (2-D, any strides) into row-major out",
        py::arg("kernel"), py::arg("x"), py::arg("out"), py::arg("threads"), py::arg("cluster"),
        py::arg("cta_bytes"), py::arg("chunk"), py::arg("stream"));
  m.def("softmax_max_cols", &softmax_max_cols, "longest row a kernel takes for these operands (-1: any)",
        py::arg("kernel"), py::arg("x"), py::arg("out"), py::arg("threads"), py::arg("cluster"),
        py::arg("cta_bytes"), py::arg("chunk"));
  m.def("softmax_bwd", &softmax_bwd, "dx = y * (dy - sum(dy * y)) row by row", py::arg("y"), py::arg("dy"),
        py::arg("dx"), py::arg("threads"), py::arg("chunk"), py::arg("stream"));
  m.def("_raise_for_test", &raise_for_test, "throw a C++ exception of `kind` ('std' or 'c10'): a test hook",
        py::arg("kind"));
  m.def("softmax_kernels", [] {
    std::vector<std::string> names;
    for (const auto& k : kForwardKernels) names.emplace_back(k.name);
    return names;
  });
#if TILED_ATTN_WITH_ATTENTION
  m.def("attention_fwd", &attention_fwd, "fused attention forward into out and lse", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("scale"), py::arg("causal"),
        py::arg("causal_offset"), py::arg("stream"));
  m.def("attention_head_dim_supported", &tiled_attn::attention_head_dim_supported, py::arg("head_dim"));
  m.attr("has_attention") = true;
#else
  m.attr("has_attention") = false;
#endif
}
