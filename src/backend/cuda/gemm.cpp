#include "backend/cuda/gemm.h"

#include "backend/cuda/convert.h"
#include "backend/cuda/skinny_gemm.h"
#include "core/error.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace jambo::backend::cuda {

namespace {
constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;  // what cuBLAS's documentation asks for on Hopper
constexpr int kMaxHeuristicCandidates = 8;              // what the heuristic returns for these shapes (H200)
// Prefill steps bring new row counts; past this many plans the cache starts over rather than grow without bound.
constexpr size_t kMaxPlans = 4096;
}  // namespace

size_t choose_gemm_candidate(std::span<const GemmCandidate> candidates) {
  if (!candidates.front().splits_k) return 0;
  for (size_t i = 1; i < candidates.size(); ++i)
    if (!candidates[i].splits_k && candidates[i].waves >= kMinWavesWithoutSplitK) return i;
  return 0;
}

// Descriptors of yᵀ [N, rows] = w (read as [K, N], transposed) · x16ᵀ [K, rows]: cuBLAS's column-major view of
// the row-major operands.
struct Gemm::LtPlan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t weights = nullptr, inputs = nullptr, outputs = nullptr;
  cublasLtMatmulAlgo_t algorithm{};

  LtPlan(int64_t num_rows, int64_t n, int64_t k, DType dtype) {
    try {
      create(num_rows, n, k, dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F);
    } catch (...) {
      destroy();  // what was created before the failure
      throw;
    }
  }
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() { destroy(); }

 private:
  void create(int64_t num_rows, int64_t n, int64_t k, cudaDataType_t type) {
    JAMBO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T;
    JAMBO_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
    JAMBO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&weights, type, uint64_t(k), uint64_t(n), k));
    JAMBO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&inputs, type, uint64_t(k), uint64_t(num_rows), k));
    JAMBO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&outputs, CUDA_R_32F, uint64_t(n), uint64_t(num_rows), n));
  }
  void destroy() {
    if (outputs != nullptr) cublasLtMatrixLayoutDestroy(outputs);
    if (inputs != nullptr) cublasLtMatrixLayoutDestroy(inputs);
    if (weights != nullptr) cublasLtMatrixLayoutDestroy(weights);
    if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
  }
};

namespace {

// cuBLASLt's ranked candidates for the plan's operation within our workspace, for operands of these alignments
// (bytes, of w, x16 and y).
std::vector<cublasLtMatmulHeuristicResult_t> ranked_candidates(cublasLtHandle_t lt, const Gemm::LtPlan& p,
                                                               const uint32_t (&alignments)[3]) {
  cublasLtMatmulPreference_t raw = nullptr;
  JAMBO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      preference(raw, cublasLtMatmulPreferenceDestroy);
  const auto set = [raw](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
    JAMBO_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, attribute, &value, sizeof(value)));
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignments[0]);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignments[1]);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignments[2]);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignments[2]);
  std::vector<cublasLtMatmulHeuristicResult_t> results(kMaxHeuristicCandidates);
  int count = 0;
  JAMBO_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.operation, p.weights, p.inputs, p.outputs, p.outputs, raw,
                                                    kMaxHeuristicCandidates, results.data(), &count));
  results.resize(size_t(count));
  return results;
}

GemmCandidate as_candidate(const cublasLtMatmulHeuristicResult_t& result) {
  int32_t split_k = 1;
  size_t written = 0;
  JAMBO_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&result.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k,
                                                          sizeof(split_k), &written));
  return {split_k > 1, result.wavesCount};
}

}  // namespace

Gemm::Gemm(cudaStream_t stream, bool pedantic, bool invariant) : stream_(stream), invariant_(invariant) {
  JAMBO_CUBLAS_CHECK(cublasCreate(&handle_));
  JAMBO_CUBLAS_CHECK(cublasLtCreate(&lt_));
  JAMBO_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  JAMBO_CUBLAS_CHECK(cublasSetMathMode(handle_, pedantic ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  workspace_ = DeviceBuffer<std::byte>(kWorkspaceBytes);
  JAMBO_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), size_t(kWorkspaceBytes)));
}

Gemm::~Gemm() {
  plans_.clear();
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (handle_ != nullptr) cublasDestroy(handle_);
}

const Gemm::LtPlan& Gemm::plan(const LtShape& shape) {
  if (const auto found = plans_.find(shape); found != plans_.end()) return *found->second;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  const auto [num_rows, n, k, dtype, w_alignment, x_alignment, y_alignment] = shape;
  auto made = std::make_unique<LtPlan>(num_rows, n, k, dtype);
  const auto results = ranked_candidates(lt_, *made, {w_alignment, x_alignment, y_alignment});
  require(!results.empty(), "cuBLASLt has no algorithm for a 16-bit GEMM of " + std::to_string(num_rows) +
                                " rows by a [" + std::to_string(n) + ", " + std::to_string(k) + "] weight");
  std::vector<GemmCandidate> candidates;
  for (const auto& result : results) candidates.push_back(as_candidate(result));
  made->algorithm = results[choose_gemm_candidate(candidates)].algo;
  return *plans_.emplace(shape, std::move(made)).first->second;
}

void Gemm::matmul16(const uint16_t* x16, int64_t num_rows, const DeviceMatrix& w, float* y) {
  // The largest power of two, up to 256, that divides the address: what an algorithm may assume of it.
  const auto alignment = [](const void* pointer) {
    const auto address = reinterpret_cast<uintptr_t>(pointer);
    return uint32_t(std::min<uintptr_t>(256, address & (~address + 1)));
  };
  const LtPlan& p = plan({num_rows, w.rows, w.cols, w.dtype, alignment(w.data), alignment(x16), alignment(y)});
  const float one = 1.0f, zero = 0.0f;
  JAMBO_CUBLAS_CHECK(cublasLtMatmul(lt_, p.operation, &one, w.data, p.weights, x16, p.inputs, &zero, y, p.outputs, y,
                                    p.outputs, &p.algorithm, workspace_.data(), size_t(kWorkspaceBytes), stream_));
}

namespace {

// 16-bit weights and a row or two of x, outside the invariant mode: the skinny GEMM's case, the only one its fusions
// take.
bool runs_skinny(const Gemm& gemm, const DeviceMatrix& w, int64_t num_rows) {
  return !gemm.invariant() && w.dtype != DType::F32 && num_rows >= 1 && num_rows <= kMaxSkinnyGemmRows;
}

// The skinny GEMM's operands for y = x · wᵀ (16-bit weights), x16 used where it has the weights' type.
SkinnyGemm skinny_params(const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                         const Narrow16& x16) {
  SkinnyGemm skinny;
  skinny.x = x, skinny.x_stride = x_stride, skinny.num_rows = num_rows;
  skinny.weight = w.data, skinny.dtype = w.dtype, skinny.n = w.rows, skinny.k = w.cols, skinny.y = y;
  if (x16.present() && x16.dtype == w.dtype) skinny.x16 = x16.data;
  return skinny;
}

SkinnyGemm swiglu_params(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* out,
                         const Narrow16& out16) {
  SkinnyGemm skinny = skinny_params(x, w.cols, num_rows, w, out, x16);
  skinny.swiglu = true, skinny.y16 = out16;
  return skinny;
}

SkinnyGemm conv_params(const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* y,
                       const DecodeConv& conv) {
  SkinnyGemm skinny = skinny_params(x, w.cols, num_rows, w, y, x16);
  skinny.conv = conv;
  return skinny;
}

// The invariant GEMM's operands (tensor_gemm.h): x [num_rows, x_stride] of w's type.
void run_invariant(Gemm& gemm, const void* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y) {
  TensorGemm operands;
  operands.w = w.data, operands.dtype = w.dtype, operands.x = x, operands.x_stride = x_stride;
  operands.y = y, operands.num_rows = num_rows, operands.n = w.rows, operands.k = w.cols;
  tensor_gemm(operands, gemm.tensor_scratch(), gemm.stream());
}

void run_linear(Gemm& gemm, const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                const Narrow16& x16) {
  if (num_rows == 0) return;
  if (w.dtype == DType::F32 && gemm.invariant()) {
    run_invariant(gemm, x, x_stride, num_rows, w, y);
    return;
  }
  if (w.dtype == DType::F32) {
    constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
    JAMBO_REQUIRE(num_rows <= kMaxInt && w.rows <= kMaxInt && w.cols <= kMaxInt && x_stride <= kMaxInt,
                  "GEMM of {} rows by a [{}, {}] weight is beyond cuBLAS's 32-bit sizes", num_rows, w.rows, w.cols);
    const int m = int(w.rows), n = int(num_rows), k = int(w.cols);
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: yᵀ [N_out, rows] = w (read as [K, N_out], transposed) · xᵀ [K, rows].
    JAMBO_CUBLAS_CHECK(cublasSgemm(gemm.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                                   static_cast<const float*>(w.data), k, x, int(x_stride), &zero, y, m));
    return;
  }
  if (runs_skinny(gemm, w, num_rows)) {
    const SkinnyGemm skinny = skinny_params(x, x_stride, num_rows, w, y, x16);
    if (skinny_gemm_applies(skinny)) {
      skinny_gemm(skinny, gemm.stream());
      return;
    }
  }
  const uint16_t* narrow = x16.data;
  if (!x16.present() || x16.dtype != w.dtype) {
    uint16_t* rounded = gemm.narrow_input(element_offset(num_rows, w.cols));
    narrow_to_16(x, x_stride, num_rows, w.cols, w.dtype == DType::BF16, rounded, gemm.stream());
    narrow = rounded;
  }
  if (gemm.invariant()) {
    run_invariant(gemm, narrow, w.cols, num_rows, w, y);
    return;
  }
  gemm.matmul16(narrow, num_rows, w, y);
}

}  // namespace

void linear(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, float* y, const Narrow16& x16) {
  run_linear(gemm, x, w.cols, num_rows, w, y, x16);
}

void linear_strided(Gemm& gemm, const float* x, int64_t x_stride, int64_t num_rows, const DeviceMatrix& w, float* y,
                    const Narrow16& x16) {
  run_linear(gemm, x, x_stride, num_rows, w, y, x16);
}

bool linear_swiglu_fuses(const Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w,
                         const Narrow16& x16) {
  return runs_skinny(gemm, w, num_rows) && skinny_gemm_applies(swiglu_params(x, num_rows, w, x16, nullptr, {}));
}

void linear_swiglu(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* out,
                   const Narrow16& out16) {
  require(linear_swiglu_fuses(gemm, x, num_rows, w, x16),
          "linear_swiglu called on operands it does not take (please report this)");
  skinny_gemm(swiglu_params(x, num_rows, w, x16, out, out16), gemm.stream());
}

bool linear_conv_fuses(const Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16,
                       const DecodeConv& conv) {
  return runs_skinny(gemm, w, num_rows) && conv.rows.num_chunks == 0 && conv.rows.num_tokens == num_rows &&
         w.rows == 2 * conv.layout.num_channels && conv.layout.kernel_size >= 1 &&
         conv.layout.kernel_size <= kMaxConvTaps &&
         skinny_gemm_applies(conv_params(x, num_rows, w, x16, nullptr, conv));
}

void linear_conv(Gemm& gemm, const float* x, int64_t num_rows, const DeviceMatrix& w, const Narrow16& x16, float* y,
                 const DecodeConv& conv) {
  require(linear_conv_fuses(gemm, x, num_rows, w, x16, conv),
          "linear_conv called on operands it does not take (please report this)");
  skinny_gemm(conv_params(x, num_rows, w, x16, y, conv), gemm.stream());
}

}  // namespace jambo::backend::cuda
