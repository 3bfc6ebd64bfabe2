#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

// This absl build has its own string_view, which StrCat needs.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference library's limit
constexpr const char* kIndexName = "model.safetensors.index.json";

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kBF16, "BF16", 2},      {DType::kF32, "F32", 4}, {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E8M0, "F8_E8M0", 1}, {DType::kI8, "I8", 1},   {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},        {DType::kU8, "U8", 1},
};

// A JSON value as a non-negative integer; floats, negatives and booleans are rejected.
bool AsNonNegative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() == 0) {  // "-0"
    *out = 0;
    return true;
  }
  return false;
}

// Product of `dims` times `elem_size`, or false on overflow (checked in dimension order, like
// the reference library, so a later zero does not excuse an earlier overflow).
bool CheckedBytes(const std::vector<int64_t>& dims, size_t elem_size, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) ||
        n > static_cast<uint64_t>(INT64_MAX)) {
      return false;
    }
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(elem_size), out);
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Bad(const std::string& label, std::string_view tensor, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": tensor '", AV(tensor), "': ", AV(what)));
}

absl::StatusOr<TensorView> ParseEntry(const std::string& label, const std::string& name,
                                      const json& e, const uint8_t* data, uint64_t data_len) {
  if (!e.is_object()) return Bad(label, name, "header entry is not an object");
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  if (dt == e.end() || sh == e.end() || off == e.end()) {
    return Bad(label, name, "header entry needs 'dtype', 'shape' and 'data_offsets'");
  }
  if (!dt->is_string()) return Bad(label, name, "dtype is not a string");
  auto dtype = ParseDType(dt->get_ref<const std::string&>());
  if (!dtype.ok()) {
    const absl::string_view msg = dtype.status().message();
    return Bad(label, name, std::string_view(msg.data(), msg.size()));
  }

  if (!sh->is_array()) return Bad(label, name, "shape is not an array");
  TensorView v;
  v.name = name;
  v.dtype = *dtype;
  v.file = label;
  for (const json& d : *sh) {
    uint64_t u;
    if (!AsNonNegative(d, &u) || u > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(label, name,
                 absl::StrCat("shape entry ", d.dump(), " is not a non-negative integer"));
    }
    v.shape.push_back(static_cast<int64_t>(u));
  }
  uint64_t want;
  if (!CheckedBytes(v.shape, DTypeSize(v.dtype), &want)) {
    return Bad(label, name, absl::StrCat("shape ", ShapeStr(v.shape), " overflows"));
  }

  uint64_t begin, end;
  if (!off->is_array() || off->size() != 2 || !AsNonNegative((*off)[0], &begin) ||
      !AsNonNegative((*off)[1], &end)) {
    return Bad(label, name, "data_offsets is not two non-negative integers");
  }
  if (begin > end) {
    return Bad(label, name, absl::StrCat("data_offsets [", begin, ", ", end, "] begin > end"));
  }
  if (end > data_len) {
    return Bad(label, name,
               absl::StrCat("data_offsets [", begin, ", ", end, "] exceed the data section (",
                            data_len, " bytes)"));
  }
  if (end - begin != want) {
    return Bad(
        label, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but ",
                     AV(DTypeName(v.dtype)), " ", ShapeStr(v.shape), " needs ", want));
  }
  v.data = data + begin;
  v.nbytes = static_cast<size_t>(want);
  return v;
}

// Parses and validates a whole file image; views point into `buf`.
absl::Status ParseImage(const uint8_t* buf, size_t len, const std::string& label,
                        std::map<std::string, TensorView>* tensors,
                        std::map<std::string, std::string>* metadata) {
  if (len < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": file is ", len, " bytes, too short for the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | buf[i];
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": header length ", n, " exceeds the 100 MB limit"));
  }
  if (n > len - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": header length ", n, " exceeds the file (", len, " bytes)"));
  }
  const uint8_t* data = buf + 8 + n;
  const uint64_t data_len = len - 8 - n;

  // The DOM drops duplicate keys silently; a callback sees each top-level key first.
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& v) {
    if (depth == 1 && ev == json::parse_event_t::key && v.is_string() &&
        !keys.insert(v.get<std::string>()).second && duplicate.empty()) {
      duplicate = v.get<std::string>();
    }
    return true;
  };
  const json header = json::parse(buf + 8, buf + 8 + n, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": header is not well-formed JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": header is not a JSON object"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": key '", duplicate, "' appears twice in the header"));
  }

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(label, ": __metadata__ is not an object"));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(label, ": __metadata__ value of '", m.key(), "' is not a string"));
        }
        (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (name.empty()) return Bad(label, name, "empty tensor name");
    ASSIGN_OR_RETURN(TensorView v, ParseEntry(label, name, *it, data, data_len));
    const uint64_t begin = static_cast<uint64_t>(v.data - data);
    const uint64_t end = begin + v.nbytes;
    if (begin != end) ranges.push_back({begin, end, &name});
    tensors->emplace(name, std::move(v));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return Bad(label, *ranges[i].name,
                 absl::StrCat("bytes [", ranges[i].begin, ", ", ranges[i].end, ") overlap tensor '",
                              *ranges[i - 1].name, "' [", ranges[i - 1].begin, ", ",
                              ranges[i - 1].end, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return s.str();
}

}  // namespace

std::string_view DTypeName(DType d) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == d) return i.name;
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.name == name) return i.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", AV(name), "'"));
}

size_t DTypeSize(DType d) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == d) return i.size;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated against overflow when the header was parsed
  return n;
}

std::string TensorView::ShapeString() const { return ShapeStr(shape); }

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    const uint8_t* buf, size_t len, const std::string& label) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = label;
  RETURN_IF_ERROR(ParseImage(buf, len, label, &f->tensors_, &f->metadata_));
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat(path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const size_t len = static_cast<size_t>(st.st_size);
  if (len > 0) {
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": mmap: ", std::strerror(err)));
    }
    f->map_ = p;
    f->map_len_ = len;
  }
  ::close(fd);  // the mapping keeps the file alive
  RETURN_IF_ERROR(
      ParseImage(static_cast<const uint8_t*>(f->map_), len, path, &f->tensors_, &f->metadata_));
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status Checkpoint::AddFile(std::unique_ptr<SafetensorsFile> file) {
  for (const auto& [name, view] : file->tensors()) {
    if (const TensorView* other = Find(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' is in both ", other->file, " and ", file->path()));
    }
  }
  for (const auto& [name, view] : file->tensors()) index_.emplace(name, &view);
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFiles(
    const std::vector<std::string>& paths) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->label_ = absl::StrJoin(paths, ", ");
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(p));
    RETURN_IF_ERROR(ckpt->AddFile(std::move(file)));
  }
  return ckpt;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromMemory(
    std::string label, std::vector<TensorView> views, std::shared_ptr<const void> owner) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->label_ = std::move(label);
  ckpt->owner_ = std::move(owner);
  ckpt->memory_views_ = std::move(views);
  for (TensorView& v : ckpt->memory_views_) {
    v.file = ckpt->label_;
    uint64_t want;
    if (v.name.empty() || !CheckedBytes(v.shape, DTypeSize(v.dtype), &want) || v.nbytes != want ||
        (v.data == nullptr && v.nbytes > 0)) {
      return Bad(ckpt->label_, v.name,
                 absl::StrCat(v.nbytes, " bytes at ", v.data == nullptr ? "null" : "memory",
                              " do not hold ", AV(DTypeName(v.dtype)), " ", ShapeStr(v.shape)));
    }
    if (!ckpt->index_.emplace(v.name, &v).second) {
      return Bad(ckpt->label_, v.name, "appears twice");
    }
  }
  return ckpt;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  const std::string index_path = (fs::path(dir) / kIndexName).string();
  if (!fs::exists(index_path, ec)) {
    std::vector<std::string> paths;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.starts_with("model") && name.ends_with(".safetensors") && it->is_regular_file(ec)) {
        paths.push_back(it->path().string());
      }
    }
    if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
    if (paths.empty()) {
      return absl::NotFoundError(absl::StrCat("no model*.safetensors in ", dir));
    }
    std::sort(paths.begin(), paths.end());
    ASSIGN_OR_RETURN(auto ckpt, OpenFiles(paths));
    ckpt->label_ = dir;
    return ckpt;
  }

  ASSIGN_OR_RETURN(std::string text, ReadText(index_path));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no 'weight_map' object"));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string* shard = it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
    // Shards are plain file names next to the index; anything else could escape the directory.
    if (shard == nullptr || shard->empty() || shard->find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": tensor '", it.key(), "' maps to ", it->dump(), ", not a file name"));
    }
    weight_map[it.key()] = *shard;
    shards.insert(*shard);
  }
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->label_ = dir;
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const std::string& shard : shards) {
    const std::string path = (fs::path(dir) / shard).string();
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      if (absl::IsNotFound(file.status())) {
        return absl::NotFoundError(
            absl::StrCat(index_path, ": shard '", shard, "' is missing (", path, ")"));
      }
      return file.status();
    }
    by_name[shard] = file->get();
    RETURN_IF_ERROR(ckpt->AddFile(*std::move(file)));
  }
  for (const auto& [tensor, shard] : weight_map) {
    const TensorView* v = ckpt->Find(tensor);
    if (v == nullptr || v->file != by_name[shard]->path()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": tensor '", tensor, "' is listed under '", shard, "' but ",
          v == nullptr ? std::string("no shard holds it") : absl::StrCat("it is in ", v->file)));
    }
  }
  std::vector<std::string> extra;
  for (const auto& [name, view] : ckpt->index_) {
    if (!weight_map.contains(name)) extra.push_back(absl::StrCat(name, " (", view->file, ")"));
  }
  if (!extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        index_path, ": ", extra.size(), " tensor(s) not in the index: ",
        absl::StrJoin(extra.begin(), extra.begin() + std::min<size_t>(extra.size(), 10), ", "),
        extra.size() > 10 ? ", ..." : ""));
  }
  return ckpt;
}

const TensorView* Checkpoint::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorView*> Checkpoint::GetAnyShape(std::string_view name,
                                                          DType dtype) const {
  const TensorView* v = Find(name);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(label_, ": missing tensor '", AV(name), "'"));
  }
  if (v->dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(AV(name), " in ", v->file, ": dtype ",
                                                   AV(DTypeName(v->dtype)), ", expected ",
                                                   AV(DTypeName(dtype))));
  }
  return v;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(std::string_view name, DType dtype,
                                                  const std::vector<int64_t>& shape) const {
  ASSIGN_OR_RETURN(const TensorView* v, GetAnyShape(name, dtype));
  if (v->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        AV(name), " in ", v->file, ": shape ", v->ShapeString(), ", expected ", ShapeStr(shape)));
  }
  return v;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is empty, reserved or repeated"));
    }
    uint64_t want;
    if (!CheckedBytes(t.shape, DTypeSize(t.dtype), &want) || t.bytes.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "': ", t.bytes.size(), " bytes do not match ",
                       AV(DTypeName(t.dtype)), " ", ShapeStr(t.shape)));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + want}}};
    offset += want;
  }
  // A name or metadata string that is not UTF-8: dropping its bad bytes and replacing them
  // (U+FFFD) give different texts.
  using Json = nlohmann::ordered_json;
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::ignore);
  if (text != header.dump(-1, ' ', false, Json::error_handler_t::replace)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header: a tensor name or metadata string is not valid UTF-8"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  }
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  bool ok = std::fwrite(len_le, 1, 8, f) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const TensorToWrite& t : tensors) {
    ok = ok &&
         (t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size());
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InvalidArgumentError(absl::StrCat(path, ": write failed"));
  }
  return absl::OkStatus();
}

}  // namespace ss
