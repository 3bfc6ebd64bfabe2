// Safetensors checkpoint reader (single file or sharded through model.safetensors.index.json)
// and a small writer used by tests and test tools.
//
// Files are mapped read-only with mmap; tensor views point into the mapping and stay valid as
// long as the owning SafetensorsFile / Checkpoint lives. Every header is validated before any
// tensor is exposed: well-formed JSON, known dtypes, shape x dtype size == byte range, offsets
// inside the data section, ranges sorted-or-not but never overlapping, and the data section
// fully inside the file. Nothing ever reads outside the mapping. Errors name the file and the
// tensor. Objects are immutable after Open and safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss {

enum class DType : uint8_t { kBF16, kF32, kF8E4M3, kF8E8M0, kI8, kI64, kI32, kU8 };

// "BF16", "F32", "F8_E4M3", "F8_E8M0", "I8", "I64", "I32", "U8".
std::string_view DTypeName(DType d);
absl::StatusOr<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType d);

// A tensor inside a mapped file. `data` is not necessarily aligned (shards are not 4 KiB
// aligned and tensors may start at any byte): read multi-byte values with memcpy.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path of the file holding it, for error messages

  int64_t numel() const;
  std::string ShapeString() const;  // "[128, 256]"
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Fails with InvalidArgument/NotFound naming the file (and the
  // tensor where one is at fault) on any malformed header.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses and validates an in-memory image (the whole file's bytes); used by the fuzz test.
  // `buf` must outlive the returned object.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(const uint8_t* buf, size_t len,
                                                                     const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: `model.safetensors.index.json` (weight_map -> shard
// files, every listed shard must exist and hold exactly the tensors the index assigns to it), or
// else every `*.safetensors` file in the directory whose name starts with "model" (a single
// `model.safetensors` is the common case). A tensor name present in two files is an error.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  // Opens exactly these files (no index); used for golden tensor files.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenFiles(
      const std::vector<std::string>& paths);
  // A checkpoint of tensors already in memory (dummy weights): `views` point into memory that
  // `owner` keeps alive as long as the checkpoint lives; each view's `file` is set to `label`.
  // InvalidArgument naming the tensor for a repeated or empty name, or for nbytes not equal to
  // the shape x dtype size (or null data with nbytes > 0).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> FromMemory(std::string label,
                                                                std::vector<TensorView> views,
                                                                std::shared_ptr<const void> owner);

  const TensorView* Find(std::string_view name) const;
  // The tensor, checked for dtype and shape; the error names the tensor, the file and what was
  // expected vs found ("layers.0.attn.wq_a.weight in /x/model.safetensors: dtype F32, expected
  // F8_E4M3").
  absl::StatusOr<const TensorView*> Get(std::string_view name, DType dtype,
                                        const std::vector<int64_t>& shape) const;
  // The tensor with any shape but the given dtype.
  absl::StatusOr<const TensorView*> GetAnyShape(std::string_view name, DType dtype) const;
  const std::map<std::string, const TensorView*>& tensors() const { return index_; }
  size_t num_files() const { return files_.size(); }

 private:
  // Takes ownership of `file` and indexes its tensors; a name already indexed is an error.
  absl::Status AddFile(std::unique_ptr<SafetensorsFile> file);

  std::string label_;  // the directory (or the file list) named in "missing tensor" errors
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<TensorView> memory_views_;  // FromMemory: the views, into owner_'s memory
  std::shared_ptr<const void> owner_;
  std::map<std::string, const TensorView*> index_;
};

// Writer for tests and the checkpoint generator: tensors are written in the given order with
// a JSON header padded to 8 bytes, exactly as the reference `safetensors` library does.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // shape x dtype size bytes, little endian
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ss
