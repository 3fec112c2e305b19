#include "backend/cuda/device_weights.h"

#include "backend/cuda/convert.h"
#include "backend/cuda/random_fill.h"
#include "core/error.h"
#include "model/random_weights.h"

#include <memory>
#include <vector>

namespace jambo::backend::cuda {

WeightMode parse_weight_mode(const std::string& name) {
  if (name == "f32") return WeightMode::F32;
  if (name == "bf16") return WeightMode::Bf16;
  if (name == "f16") return WeightMode::F16;
  fail("unknown CUDA weight mode '{}' (expected f32, bf16 or f16)", name);
}

DeviceWeights::DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream)
    : DeviceWeights(model, mode, stream, Fill::Values) {}

DeviceWeights::DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream, Fill fill)
    : mode_(mode),
      stream_(stream),
      random_recipe_(model.random_recipe.get()),
      count_only_(fill == Fill::CountOnly),
      fill_values_(fill == Fill::Values) {
  load(model);
}

DeviceWeights::DeviceWeights(const model::Model& model, WeightMode mode, cudaStream_t stream, const HostWeights& saved)
    : DeviceWeights(model, mode, stream, Fill::Nothing) {
  const std::vector<Allocation> targets = allocations();
  JAMBO_ASSERT(targets.size() == saved.num_bytes.size());
  int64_t offset = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    JAMBO_ASSERT(targets[i].num_bytes == saved.num_bytes[i]);
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(targets[i].data), saved.bytes.data() + offset,
                                     size_t(targets[i].num_bytes), cudaMemcpyHostToDevice, stream_));
    offset += targets[i].num_bytes;
  }
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceWeights::save(HostWeights& into) const {
  into.num_bytes.clear();
  const std::vector<Allocation> sources = allocations();
  int64_t total = 0;
  for (const Allocation& source : sources) total += source.num_bytes;
  if (into.bytes.size() != total) into.bytes = PinnedBuffer<std::byte>(total);
  int64_t offset = 0;
  for (const Allocation& source : sources) {
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(into.bytes.data() + offset, source.data, size_t(source.num_bytes),
                                     cudaMemcpyDeviceToHost, stream_));
    offset += source.num_bytes;
  }
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const Allocation& source : sources) into.num_bytes.push_back(source.num_bytes);
}

int64_t DeviceWeights::bytes_needed(const model::Model& model, WeightMode mode) {
  return DeviceWeights(model, mode, nullptr, Fill::CountOnly).bytes_on_device;
}

void DeviceWeights::load(const model::Model& model) {
  const model::JambaConfig& config = model.config;
  const model::ModelWeights& host = model.weights;
  embed_tokens = upload_as_f32(host.embed_tokens);
  final_norm = upload_vector(host.final_norm);
  lm_head = upload_matrix(host.lm_head);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const model::LayerWeights& in = host.layers[layer];
    DeviceLayer out;
    out.input_norm = upload_vector(in.input_norm);
    out.pre_ff_norm = upload_vector(in.pre_ff_norm);
    if (config.mixer_kinds[layer] == model::MixerKind::Attention) {
      out.attention = {upload_matrix(in.attention.q_proj), upload_matrix(in.attention.k_proj),
                       upload_matrix(in.attention.v_proj), upload_matrix(in.attention.o_proj)};
    } else {
      const model::MambaWeights& m = in.mamba;
      DeviceMamba& d = out.mamba;
      d.in_proj = upload_matrix(m.in_proj);
      d.in_proj_bias = upload_vector(m.in_proj_bias);
      d.conv_weight = upload_vector(m.conv_weight);
      d.conv_bias = upload_vector(m.conv_bias);
      d.x_proj = upload_matrix(m.x_proj);
      d.dt_norm = upload_vector(m.dt_norm);
      d.b_norm = upload_vector(m.b_norm);
      d.c_norm = upload_vector(m.c_norm);
      d.dt_proj = upload_matrix(m.dt_proj);
      d.dt_proj_bias = upload_vector(m.dt_proj_bias);
      d.a = negative_exp(m.A_log);
      d.d = upload_vector(m.D);
      d.out_proj = upload_matrix(m.out_proj);
      d.out_proj_bias = upload_vector(m.out_proj_bias);
    }
    auto upload_mlp = [&](const model::MlpWeights& mlp) {
      return DeviceMlp{upload_stacked(mlp.gate_proj, mlp.up_proj), upload_matrix(mlp.down_proj)};
    };
    if (config.ffn_kinds[layer] == model::FfnKind::Moe) {
      out.moe.router = upload_matrix(in.moe.router);
      for (const model::MlpWeights& expert : in.moe.experts) out.moe.experts.push_back(upload_mlp(expert));
      out.moe.expert_matrices = upload_expert_table(out.moe.experts, in.moe.experts);
    } else {
      out.mlp = upload_mlp(in.mlp);
    }
    layers.push_back(std::move(out));
  }
  if (count_only_) return;
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  staging_ = DeviceBuffer<uint16_t>();  // only needed while loading
  staging_f32_ = DeviceBuffer<float>();
  random_recipe_ = nullptr;  // an update's values come from the host
  fill_values_ = true;
}

void DeviceWeights::update(const model::WeightUpdate& update) {
  std::vector<std::pair<const TensorView*, Placement>> writes;
  for (const model::WeightUpdate::Piece& piece : update.pieces) {
    const auto [first, last] = placements_.equal_range(std::pair(piece.target.data, piece.target.numel()));
    JAMBO_ASSERT(first != last);  // every weight the model reads was uploaded
    for (auto it = first; it != last; ++it) writes.emplace_back(&piece.source, it->second);
  }
  for (const model::WeightUpdate::Piece& piece : update.pieces) {
    if (!update.on_device) break;  // a folder's values were checked on the host
    JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the fp32 staging buffer is reused tensor after tensor
    float* wide = staging_f32_.reserve(piece.source.numel());
    put_as_f32(piece.source, wide);
    const int64_t nonfinite = count_nonfinite(wide, piece.source.numel(), stream_);
    JAMBO_REQUIRE(nonfinite == 0, "tensor '{}': {} of its values are NaN or infinite", piece.name, nonfinite);
  }
  if (mode_ == WeightMode::F16)
    for (const auto& [values, placement] : writes)
      if (placement.conversion == Conversion::Sixteen && values->dtype != DType::F16) widen_within_f16(*values);
  for (const auto& [values, placement] : writes) put(*values, placement);
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  staging_ = DeviceBuffer<uint16_t>();
  staging_f32_ = DeviceBuffer<float>();
}

void DeviceWeights::place(const TensorView& view, Conversion conversion, void* out) {
  if (!count_only_) placements_.emplace(std::pair(view.data, view.numel()), Placement{conversion, out});
}

void DeviceWeights::put(const TensorView& values, const Placement& placement) {
  switch (placement.conversion) {
    case Conversion::F32:
      return put_as_f32(values, static_cast<float*>(placement.out));
    case Conversion::Sixteen:
      return put_as_16(values, static_cast<uint16_t*>(placement.out));
    case Conversion::NegativeExp:
      put_as_f32(values, static_cast<float*>(placement.out));
      return negative_exp_f32(static_cast<float*>(placement.out), values.numel(), static_cast<float*>(placement.out),
                              stream_);
  }
}

const float* DeviceWeights::upload_as_f32(const TensorView& view) {
  const int64_t count = view.numel();
  const auto key = std::pair(view.data, count);
  if (const auto found = uploaded_.find(key); found != uploaded_.end()) return found->second;
  bytes_on_device += device_offset(count, sizeof(float));
  if (count_only_) return uploaded_.emplace(key, nullptr).first->second;
  DeviceBuffer<float>& buffer = owned_.emplace_back(count);
  put_as_f32(view, buffer.data());
  uploaded_.emplace(key, buffer.data());
  place(view, Conversion::F32, buffer.data());
  return buffer.data();
}

void DeviceWeights::put_as_f32(const TensorView& view, float* out) {
  if (!fill_values_) return;
  if (view.dtype == DType::F32) {
    put_stored(view, out);
    return;
  }
  // The staging buffer is reused tensor after tensor: wait until the last widening has read it.
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int64_t count = view.numel();
  staging_.reserve(count);
  put_stored(view, staging_.data());
  widen_to_f32(staging_.data(), view.dtype == DType::BF16, count, out, stream_);
}

// The f16 mode's matrices that are not stored as f16: widened to fp32 on the GPU, then rounded to IEEE half.
void DeviceWeights::put_as_f16(const TensorView& view, uint16_t* out) {
  const int64_t count = view.numel();
  narrow_to_16(widen_within_f16(view), count, 1, count, /*to_bf16=*/false, out, stream_);
}

// A value beyond half's range would become infinite: refused, naming the tensor.
float* DeviceWeights::widen_within_f16(const TensorView& view) {
  const int64_t count = view.numel();
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the fp32 staging buffer is reused tensor after tensor
  float* wide = staging_f32_.reserve(count);
  put_as_f32(view, wide);
  const int64_t overflowing = count_beyond_f16(wide, count, stream_);
  JAMBO_REQUIRE(overflowing == 0,
                "{}: {} of its values lie beyond IEEE half's range (65504); the f16 weight mode cannot hold this "
                "checkpoint (use --cuda-weights bf16)",
                view.name, overflowing);
  return wide;
}

const float* DeviceWeights::upload_vector(const TensorView& view) {
  return view.empty() ? nullptr : upload_as_f32(view);
}

DType DeviceWeights::matrix_dtype(DType stored) const {
  if (mode_ == WeightMode::F32 || (mode_ == WeightMode::Bf16 && stored == DType::F32)) return DType::F32;
  return mode_ == WeightMode::F16 ? DType::F16 : stored;
}

DeviceMatrix DeviceWeights::upload_matrix(const TensorView& view) {
  const DType dtype = matrix_dtype(view.dtype);
  return {dtype == DType::F32 ? static_cast<const void*>(upload_as_f32(view)) : upload_as_16(view), dtype, view.rows(),
          view.cols()};
}

// Not shared with other tensors (a checkpoint ties no MLP matrix), so not looked up among earlier uploads.
DeviceMatrix DeviceWeights::upload_stacked(const TensorView& top, const TensorView& bottom) {
  JAMBO_REQUIRE(matrix_dtype(top.dtype) == matrix_dtype(bottom.dtype) && top.cols() == bottom.cols(),
                "{} ({} [{}, {}]) and {} ({} [{}, {}]) are held as one matrix on the GPU, so they need one width and, "
                "in this weight mode, one type",
                top.name, dtype_name(top.dtype), top.rows(), top.cols(), bottom.name, dtype_name(bottom.dtype),
                bottom.rows(), bottom.cols());
  const DType dtype = matrix_dtype(top.dtype);
  DeviceMatrix stacked{nullptr, dtype, top.rows() + bottom.rows(), top.cols()};
  const int64_t count = device_offset(stacked.rows, stacked.cols);
  bytes_on_device += device_offset(count, dtype_size(dtype));
  if (count_only_) return stacked;
  if (dtype == DType::F32) {
    float* data = owned_.emplace_back(count).data();
    put_as_f32(top, data);
    put_as_f32(bottom, data + top.numel());
    place(top, Conversion::F32, data);
    place(bottom, Conversion::F32, data + top.numel());
    stacked.data = data;
  } else {
    uint16_t* data = owned_16_.emplace_back(count).data();
    put_as_16(top, data);
    put_as_16(bottom, data + top.numel());
    place(top, Conversion::Sixteen, data);
    place(bottom, Conversion::Sixteen, data + top.numel());
    stacked.data = data;
  }
  return stacked;
}

// A few pointers per layer, not counted among the weights' bytes. The grouped expert GEMMs read every expert's
// matrix of a kind with expert 0's type and shape: a checkpoint whose experts differ is refused, naming one.
const void* const* DeviceWeights::upload_expert_table(const std::vector<DeviceMlp>& experts,
                                                      const std::vector<model::MlpWeights>& host_experts) {
  const std::pair<DeviceMatrix DeviceMlp::*, TensorView model::MlpWeights::*> kinds[] = {
      {&DeviceMlp::gate_up, &model::MlpWeights::gate_proj}, {&DeviceMlp::down_proj, &model::MlpWeights::down_proj}};
  std::vector<const void*> table;  // [2, E]
  for (const auto& [device_matrix, host_view] : kinds)
    for (size_t e = 0; e < experts.size(); ++e) {
      const DeviceMatrix &first = experts.front().*device_matrix, &matrix = experts[e].*device_matrix;
      JAMBO_REQUIRE(matrix.dtype == first.dtype && matrix.rows == first.rows && matrix.cols == first.cols,
                    "{} is {} [{}, {}] where expert 0's is {} [{}, {}]: the CUDA backend needs a layer's experts "
                    "alike",
                    (host_experts[e].*host_view).name, dtype_name(matrix.dtype), matrix.rows, matrix.cols,
                    dtype_name(first.dtype), first.rows, first.cols);
      table.push_back(matrix.data);
    }
  if (count_only_) return nullptr;
  DeviceBuffer<const void*>& buffer = expert_tables_.emplace_back(int64_t(table.size()));
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(buffer.data(), table.data(), table.size() * sizeof(const void*),
                                   cudaMemcpyHostToDevice, stream_));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `table` goes
  return buffer.data();
}

const void* DeviceWeights::upload_as_16(const TensorView& view) {
  JAMBO_ASSERT(matrix_dtype(view.dtype) != DType::F32);
  const int64_t count = view.numel();
  const auto key = std::pair(view.data, count);
  if (const auto found = uploaded_16_.find(key); found != uploaded_16_.end()) return found->second;
  bytes_on_device += device_offset(count, 2);
  if (count_only_) return uploaded_16_.emplace(key, nullptr).first->second;
  DeviceBuffer<uint16_t>& buffer = owned_16_.emplace_back(count);
  put_as_16(view, buffer.data());
  uploaded_16_.emplace(key, buffer.data());
  place(view, Conversion::Sixteen, buffer.data());
  return buffer.data();
}

void DeviceWeights::put_as_16(const TensorView& view, uint16_t* out) {
  if (!fill_values_) return;
  if (mode_ == WeightMode::F16 && view.dtype != DType::F16)
    put_as_f16(view, out);
  else
    put_stored(view, out);
}

// In place over the upload of A_log (no other tensor shares its host data), so that the f32 mode of an fp32
// checkpoint holds exactly the checkpoint's bytes.
const float* DeviceWeights::negative_exp(const TensorView& a_log) {
  const float* values = upload_as_f32(a_log);
  const auto key = std::pair(a_log.data, a_log.numel());
  uploaded_.erase(key);
  if (count_only_) return values;
  if (fill_values_) negative_exp_f32(values, a_log.numel(), const_cast<float*>(values), stream_);
  const auto placed = placements_.find(key);
  JAMBO_ASSERT(placed != placements_.end() && placed->second.out == values);
  placed->second.conversion = Conversion::NegativeExp;
  return values;
}

// A view's bytes as stored: copied from the host, or generated on the GPU for a model without host data. The
// few tensors whose values need log and exp (A_log, dt_proj.bias: [Di, N] and [Di] per Mamba layer) are made
// on the host there, since the GPU's log and exp differ from glibc's in the last bit.
void DeviceWeights::put_stored(const TensorView& view, void* out) {
  const int64_t num_bytes = device_offset(view.numel(), dtype_size(view.dtype));
  if (random_recipe_ == nullptr) {
    // From the host, or from the GPU (an update shared by CUDA IPC).
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(out, view.data, size_t(num_bytes), cudaMemcpyDefault, stream_));
    return;
  }
  const model::RandomTensor& tensor = random_recipe_->tensor(view);
  if (tensor.init.is_arithmetic()) {
    fill_random(tensor, out, stream_);
    return;
  }
  std::vector<std::byte> host(static_cast<size_t>(num_bytes));
  model::RandomWeights::fill_host(tensor, host.data(), 0, tensor.numel);
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(out, host.data(), size_t(num_bytes), cudaMemcpyHostToDevice, stream_));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `host` goes
}

std::vector<DeviceWeights::Allocation> DeviceWeights::allocations() const {
  std::vector<Allocation> out;
  for (const DeviceBuffer<float>& buffer : owned_) out.push_back({buffer.data(), device_offset(buffer.size(), 4)});
  for (const DeviceBuffer<uint16_t>& buffer : owned_16_)
    out.push_back({buffer.data(), device_offset(buffer.size(), 2)});
  return out;
}

}  // namespace jambo::backend::cuda
