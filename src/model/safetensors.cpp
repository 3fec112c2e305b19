// safetensors layout: an 8-byte little-endian header length, a JSON header mapping each tensor name
// to {dtype, shape, data_offsets: [begin, end)} relative to the data that follows the header.
#include "model/safetensors.h"

#include "core/error.h"
#include "core/json.h"
#include "model/finite_values.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace jambo::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the limit of the reference implementation

// A read-only memory map of a whole regular file. Anything else is refused before it is opened: opening a FIFO
// waits for a writer.
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    std::error_code error;
    const fs::file_status status = fs::status(path, error);  // a missing file: open says so
    JAMBO_REQUIRE(!fs::exists(status) || fs::is_regular_file(status), "{}: not a regular file", path.string());
    // Non-blocking too, should the path be swapped for a FIFO after the check; fstat below refuses it then.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    JAMBO_REQUIRE(fd >= 0, "{}: cannot open the file: {}", path.string(), std::strerror(errno));
    struct stat info {};
    const bool is_file = ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
    size_ = is_file ? int64_t(info.st_size) : 0;
    if (size_ > 0) data_ = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    JAMBO_REQUIRE(is_file, "{}: not a regular file", path.string());
    JAMBO_REQUIRE(data_ != MAP_FAILED, "{}: cannot map the file: {}", path.string(), std::strerror(errno));
  }
  ~MappedFile() {
    if (data_ != nullptr && data_ != MAP_FAILED) ::munmap(data_, size_t(size_));
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return static_cast<const std::byte*>(data_); }
  int64_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  int64_t size_ = 0;
};

// One parsed safetensors file: its map, its tensors, and aligned copies of any tensor whose bytes
// are not aligned to its element size in the file (the format does not promise alignment).
struct SafetensorsFile {
  explicit SafetensorsFile(const fs::path& path) : source(path.string()), map(path) {}
  std::string source;
  MappedFile map;
  std::map<std::string, TensorView> tensors;
  std::vector<std::unique_ptr<std::byte[]>> aligned_copies;
};

struct FileSet {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
};

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

DType parse_dtype(const std::string& source, const std::string& name, const std::string& dtype) {
  if (dtype == "F32") return DType::F32;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F16") return DType::F16;
  fail("{}: tensor '{}' has dtype {}, which is not supported (F32, BF16 or F16)", source, name, dtype);
}

std::vector<int64_t> parse_integer_list(const std::string& source, const std::string& name,
                                        const json& entry, const char* field) {
  const json* value = entry.contains(field) ? &entry.at(field) : nullptr;
  JAMBO_REQUIRE(value != nullptr && value->is_array(), "{}: tensor '{}' has no list '{}' in the header",
                source, name, field);
  std::vector<int64_t> out;
  for (const json& item : *value) {
    JAMBO_REQUIRE(item.is_number_unsigned(),
                  "{}: tensor '{}' has '{}' = {}, expected non-negative integers", source, name,
                  field, describe_json(*value));
    JAMBO_REQUIRE(item.get<uint64_t>() < (uint64_t(1) << 62), "{}: tensor '{}' has '{}' = {}, out of range",
                  source, name, field, describe_json(*value));
    out.push_back(item.get<int64_t>());
  }
  return out;
}

// numel * element size, or -1 when it exceeds `limit` bytes (so no product can overflow).
int64_t bytes_needed(const std::vector<int64_t>& shape, int64_t element_size, int64_t limit) {
  int64_t bytes = element_size;
  for (int64_t extent : shape) {
    if (extent != 0 && bytes > limit / extent) return -1;
    bytes *= extent;
  }
  return bytes;
}

// Where element `index` of a tensor of this shape sits, for messages: nothing for a vector.
std::string position_of(const std::vector<int64_t>& shape, int64_t index) {
  if (shape.size() < 2) return "";
  std::vector<int64_t> coordinates(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coordinates[d] = index % shape[d];
    index /= shape[d];
  }
  if (shape.size() == 2) return fmt::format(" (row {}, column {})", coordinates[0], coordinates[1]);
  return fmt::format(" (element {})", shape_string(coordinates));
}

std::string describe_nonfinite(float value) { return std::isnan(value) ? "NaN" : value > 0 ? "inf" : "-inf"; }

struct DataRange {
  int64_t begin, end;
  std::string name;
};

// Parses one header entry; `data` is the start of the data section of `data_size` bytes.
TensorView parse_entry(SafetensorsFile& file, const std::string& name, const json& entry,
                       const std::byte* data, int64_t data_size, std::vector<DataRange>& ranges) {
  const std::string& source = file.source;
  JAMBO_REQUIRE(entry.is_object() && entry.contains("dtype") && entry.at("dtype").is_string(),
                "{}: tensor '{}' has no string 'dtype' in the header", source, name);
  TensorView view;
  view.name = name;
  view.dtype = parse_dtype(source, name, entry.at("dtype").get<std::string>());
  view.shape = parse_integer_list(source, name, entry, "shape");
  const std::vector<int64_t> offsets = parse_integer_list(source, name, entry, "data_offsets");
  JAMBO_REQUIRE(offsets.size() == 2, "{}: tensor '{}' has data_offsets {}, expected [begin, end]",
                source, name, shape_string(offsets));
  const int64_t begin = offsets[0], end = offsets[1];
  JAMBO_REQUIRE(begin <= end, "{}: tensor '{}' has data_offsets [{}, {}] with begin after end",
                source, name, begin, end);
  JAMBO_REQUIRE(end <= data_size,
                "{}: tensor '{}' has data_offsets [{}, {}] beyond the end of the data ({} bytes); "
                "the file is truncated or corrupt", source, name, begin, end, data_size);
  const int64_t needed = bytes_needed(view.shape, dtype_size(view.dtype), data_size);
  JAMBO_REQUIRE(needed == end - begin,
                "{}: tensor '{}' of shape {} and dtype {} needs {} bytes, but data_offsets [{}, {}] "
                "hold {}", source, name, shape_string(view.shape), dtype_name(view.dtype),
                needed < 0 ? "more than the file's" : std::to_string(needed), begin, end, end - begin);
  ranges.push_back(DataRange{begin, end, name});

  const std::byte* bytes = data + begin;
  if (reinterpret_cast<uintptr_t>(bytes) % dtype_size(view.dtype) != 0) {
    file.aligned_copies.emplace_back(new std::byte[size_t(needed)]);
    std::memcpy(file.aligned_copies.back().get(), bytes, size_t(needed));
    bytes = file.aligned_copies.back().get();
  }
  view.data = bytes;
  return view;
}

void require_no_overlap(const std::string& source, std::vector<DataRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const DataRange& a, const DataRange& b) { return a.begin < b.begin; });
  const DataRange* furthest = nullptr;  // the range reaching furthest so far
  for (const DataRange& range : ranges) {
    if (range.begin == range.end) continue;
    JAMBO_REQUIRE(furthest == nullptr || furthest->end <= range.begin,
                  "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] have overlapping data ranges", source,
                  furthest->name, furthest->begin, furthest->end, range.name, range.begin, range.end);
    if (furthest == nullptr || range.end > furthest->end) furthest = &range;
  }
}

std::unique_ptr<SafetensorsFile> read_safetensors(const fs::path& path) {
  auto file = std::make_unique<SafetensorsFile>(path);
  const std::string& source = file->source;
  const int64_t file_size = file->map.size();
  JAMBO_REQUIRE(file_size >= 8, "{}: {} bytes is too small for a safetensors file", source, file_size);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | uint8_t(file->map.data()[i]);
  JAMBO_REQUIRE(header_bytes <= uint64_t(file_size - 8),
                "{}: header length {} exceeds the file size ({} bytes)", source, header_bytes, file_size);
  JAMBO_REQUIRE(header_bytes <= kMaxHeaderBytes, "{}: header length {} exceeds the limit of {} bytes",
                source, header_bytes, kMaxHeaderBytes);

  json header;
  try {
    header = parse_json(std::string_view(reinterpret_cast<const char*>(file->map.data() + 8), header_bytes));
  } catch (const Error& error) {
    fail("{}: header: {}", source, error.what());
  }
  JAMBO_REQUIRE(header.is_object(), "{}: the header is not a JSON object", source);

  const std::byte* data = file->map.data() + 8 + header_bytes;
  const int64_t data_size = file_size - 8 - int64_t(header_bytes);
  std::vector<DataRange> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    file->tensors[name] = parse_entry(*file, name, entry, data, data_size, ranges);
  }
  require_no_overlap(source, std::move(ranges));
  return file;
}


// A shard must lie in the model folder: a plain file name, no folder in it, no way up.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// weight_map of model.safetensors.index.json: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const json index = read_json_file(index_path);
  const bool has_map = index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object();
  JAMBO_REQUIRE(has_map, "{}: no object 'weight_map'", index_path.string());
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index.at("weight_map").items()) {
    JAMBO_REQUIRE(shard.is_string(), "{}: 'weight_map' entry '{}' = {} is not a file name",
                  index_path.string(), name, describe_json(shard));
    JAMBO_REQUIRE(is_plain_file_name(shard.get<std::string>()),
                  "{}: 'weight_map' entry '{}' = {} is not a plain file name in the model folder",
                  index_path.string(), name, describe_json(shard));
    weight_map[name] = shard.get<std::string>();
  }
  return weight_map;
}

// A path that cannot be looked at (a name too long, say) is not found, rather than an exception of the library's.
bool path_exists(const fs::path& path) {
  std::error_code error;
  return fs::exists(fs::status(path, error));
}

}  // namespace

void require_model_folder(const fs::path& folder) {
  std::error_code error;  // a path that cannot be looked at (too long, say) is not found
  const fs::file_status status = fs::status(folder, error);
  JAMBO_REQUIRE(fs::exists(status), "{}: model folder not found", folder.string());
  JAMBO_REQUIRE(!fs::is_regular_file(status), "'{}' is a file; give the model folder that holds it", folder.string());
  JAMBO_REQUIRE(fs::is_directory(status), "'{}' is not a folder; give the model folder", folder.string());
}

Checkpoint Checkpoint::open(const fs::path& folder) {
  require_model_folder(folder);
  const fs::path index_path = folder / "model.safetensors.index.json";
  const fs::path single_path = folder / "model.safetensors";
  auto file_set = std::make_shared<FileSet>();
  Checkpoint checkpoint;
  if (path_exists(index_path)) {
    checkpoint.source_ = index_path.string();
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [name, shard] : read_weight_map(index_path)) {
      if (!shards.contains(shard)) {
        const fs::path shard_path = folder / shard;
        JAMBO_REQUIRE(path_exists(shard_path), "{}: shard '{}' (holding tensor '{}') not found: {}",
                      checkpoint.source_, shard, name, shard_path.string());
        file_set->files.push_back(read_safetensors(shard_path));
        shards[shard] = file_set->files.back().get();
      }
      const SafetensorsFile& file = *shards[shard];
      const auto found = file.tensors.find(name);
      JAMBO_REQUIRE(found != file.tensors.end(), "{}: tensor '{}' is mapped to '{}', which does not contain it",
                    checkpoint.source_, name, shard);
      checkpoint.tensors_[name] = Entry{found->second, file.source};
    }
  } else {
    JAMBO_REQUIRE(path_exists(single_path), "{}: no model.safetensors or model.safetensors.index.json in the folder",
                  folder.string());
    checkpoint.source_ = single_path.string();
    file_set->files.push_back(read_safetensors(single_path));
    for (const auto& [name, view] : file_set->files.back()->tensors)
      checkpoint.tensors_[name] = Entry{view, checkpoint.source_};
  }
  checkpoint.files_ = std::move(file_set);
  return checkpoint;
}

Checkpoint Checkpoint::on_device(std::vector<TensorView> views, std::string source, std::shared_ptr<void> storage) {
  Checkpoint checkpoint;
  checkpoint.source_ = std::move(source);
  checkpoint.files_ = std::move(storage);
  checkpoint.on_device_ = true;
  for (TensorView& view : views) {
    const std::string name = view.name;
    JAMBO_REQUIRE(checkpoint.tensors_.emplace(name, Entry{std::move(view), checkpoint.source_}).second,
                  "{}: tensor '{}' is given twice", checkpoint.source_, name);
  }
  return checkpoint;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  const auto found = tensors_.find(name);
  return found == tensors_.end() ? nullptr : &found->second.view;
}

TensorView Checkpoint::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const auto found = tensors_.find(name);
  JAMBO_REQUIRE(found != tensors_.end(), "{}: tensor '{}' not found", source_, name);
  const Entry& entry = found->second;
  JAMBO_REQUIRE(entry.view.shape == expected_shape, "{}: tensor '{}' has shape {}, expected {}",
                entry.file, name, shape_string(entry.view.shape), shape_string(expected_shape));
  return entry.view;
}

void Checkpoint::require_finite(std::span<const std::string> names) const {
  JAMBO_ASSERT(!on_device_);
  std::vector<TensorView> views;
  for (const std::string& name : names) views.push_back(tensors_.at(name).view);
  const std::optional<NonFiniteValue> found = find_nonfinite(views);
  if (!found) return;
  const std::string& name = names[found->view];
  fail("{}: tensor '{}' holds {} at index {}{}", tensors_.at(name).file, name, describe_nonfinite(found->value),
       found->index, position_of(views[found->view].shape, found->index));
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

}  // namespace jambo::model
