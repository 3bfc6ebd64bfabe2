#include "gpu_worker/expert_store_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/expert_store_format.h"
#include "common/shm_segment.h"
#include "common/status.h"

namespace ss::gpu {

std::string ExpertStoreSegmentName(std::string_view shm_name) {
  return ::ss::ExpertStoreSegmentName(shm_name);
}

ExpertStoreMap::~ExpertStoreMap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::unique_ptr<ExpertStoreMap>> ExpertStoreMap::Open(
    const std::string& segment_name, const ModelConfig& model) {
  const std::string posix =
      segment_name.empty() || segment_name.front() != '/' ? "/" + segment_name : segment_name;
  const std::string where = absl::StrCat("/dev/shm", posix);
  const auto bad = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("expert store ", where, ": ", why));
  };
  const int fd = ::shm_open(posix.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no expert store ", where,
                       " (its expert worker keeps the store private, is on another host, or is "
                       "gone)"));
    }
    return bad(absl::StrCat("shm_open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return bad(absl::StrCat("fstat: ", std::strerror(err)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kExpertStoreHeaderBytes) {
    ::close(fd);
    return bad(absl::StrCat(size, " bytes, smaller than the header (incomplete, or not a store)"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return bad(absl::StrCat("mmap: ", std::strerror(map_err)));
  std::unique_ptr<ExpertStoreMap> m(new ExpertStoreMap());
  m->name_ = segment_name;
  m->data_ = static_cast<const uint8_t*>(p);
  m->size_ = size;

  absl::StatusOr<const ExpertStoreHeader*> parsed = ParseExpertStore(m->data_, size);
  if (!parsed.ok()) return bad(parsed.status().message());
  const ExpertStoreHeader& h = **parsed;
  if (!ProcessAlive(h.owner_pid, h.owner_start_time)) {
    return bad(absl::StrCat("its owner, process ", h.owner_pid,
                            ", is dead (a leftover; the next expert worker of that name "
                            "reclaims it)"));
  }
  if (const uint64_t ns = PidNamespaceId();
      h.pid_namespace != 0 && ns != 0 && h.pid_namespace != ns) {
    return bad("its owner runs in another PID namespace");
  }
  if (h.dim != model.dim || h.inter != model.moe_inter_dim ||
      h.num_experts != model.n_routed_experts) {
    return bad(absl::StrCat("holds dim ", h.dim, ", I ", h.inter, ", ", h.num_experts,
                            " experts; the model has dim ", model.dim, ", I ", model.moe_inter_dim,
                            ", ", model.n_routed_experts, " experts"));
  }
  const int64_t n_ids = model.n_layers + model.n_mtp_layers;
  m->layer_offset_.assign(n_ids, -1);
  const ExpertStoreLayerEntry* table = ExpertStoreLayers(m->data_);
  for (uint32_t i = 0; i < h.layer_count; ++i) {
    if (table[i].layer >= n_ids) {
      return bad(absl::StrCat("holds layer ", table[i].layer, "; the model has ", n_ids,
                              " layer ids (blocks and MTP blocks)"));
    }
    m->layer_offset_[table[i].layer] = static_cast<int64_t>(table[i].offset);
  }
  // The header's offsets equal the recomputed geometry (ParseExpertStore checked them).
  absl::StatusOr<ExpertStoreGeometry> g = ComputeExpertStoreGeometry(
      h.dim, h.inter, h.num_experts, h.slice_index, h.slice_count, h.tile_rows);
  if (!g.ok()) return bad(std::string(g.status().message()));
  m->layout_ = *g;
  return m;
}

const uint8_t* ExpertStoreMap::expert(int layer, int64_t e) const {
  if (layer < 0 || layer >= static_cast<int>(layer_offset_.size()) || layer_offset_[layer] < 0 ||
      e < 0 || e >= layout_.num_experts) {
    return nullptr;
  }
  return data_ + layer_offset_[layer] + e * layout_.expert_stride;
}

absl::StatusOr<std::unique_ptr<ExpertStoreSet>> ExpertStoreSet::Open(
    const std::map<int64_t, ExpertLayerStores>& layers, const ModelConfig& model) {
  std::unique_ptr<ExpertStoreSet> set(new ExpertStoreSet());
  std::map<std::string, const ExpertStoreMap*> opened;  // by segment name
  std::map<std::string, std::string> missing;           // segment name -> NotFound's message
  for (const auto& [layer, stores] : layers) {
    std::vector<const ExpertStoreMap*> slices;
    std::string reason;
    for (size_t j = 0; j < stores.shm_names.size() && reason.empty(); ++j) {
      const std::string& shm = stores.shm_names[j];
      if (shm.empty()) {
        reason = absl::StrCat("layer ", layer, ": slice ", j, " of this rank's ",
                              stores.shm_names.size(),
                              " is served over gRPC (its expert worker is on another host)");
        break;
      }
      const std::string seg = ExpertStoreSegmentName(shm);
      if (auto it = missing.find(seg); it != missing.end()) {
        reason = it->second;
        break;
      }
      const ExpertStoreMap* map = nullptr;
      if (auto it = opened.find(seg); it != opened.end()) {
        map = it->second;
      } else {
        absl::StatusOr<std::unique_ptr<ExpertStoreMap>> m = ExpertStoreMap::Open(seg, model);
        if (absl::IsNotFound(m.status())) {
          reason = missing[seg] = std::string(m.status().message());
          break;
        }
        if (!m.ok()) return m.status();
        map = m->get();
        opened[seg] = map;
        set->maps_.push_back(std::move(*m));
      }
      const StoreExpertLayout& l = map->layout();
      if (stores.slice_count > 0 && l.slice_count != stores.slice_count) {
        return absl::FailedPreconditionError(
            absl::StrCat("expert store ", seg, " holds slice ", l.slice_index, "/", l.slice_count,
                         "; layer ", layer, " is cut into ", stores.slice_count, " slices"));
      }
      if (!slices.empty() && l.slice_index <= slices.back()->layout().slice_index) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", layer, ": expert store ", seg, " holds slice ", l.slice_index,
            ", not after slice ", slices.back()->layout().slice_index, " of the store before it"));
      }
      if (map->expert(static_cast<int>(layer), 0) == nullptr) {
        reason = absl::StrCat("layer ", layer, ": expert store ", seg, " does not hold it");
        break;
      }
      slices.push_back(map);
    }
    if (reason.empty()) {
      set->slices_[layer] = std::move(slices);
    } else {
      set->reasons_[layer] = std::move(reason);
    }
  }
  return set;
}

bool ExpertStoreSet::streamable(int64_t layer) const { return slices_.count(layer) != 0; }

const std::vector<const ExpertStoreMap*>& ExpertStoreSet::slices(int64_t layer) const {
  static const std::vector<const ExpertStoreMap*> kNone;
  auto it = slices_.find(layer);
  return it == slices_.end() ? kNone : it->second;
}

const std::string& ExpertStoreSet::reason(int64_t layer) const {
  static const std::string kNone;
  if (auto it = reasons_.find(layer); it != reasons_.end()) return it->second;
  if (slices_.count(layer) == 0) {
    static const std::string kUnknown = "no expert stores were given for this layer";
    return kUnknown;
  }
  return kNone;
}

std::vector<const ExpertStoreMap*> ExpertStoreSet::maps() const {
  std::vector<const ExpertStoreMap*> out;
  for (const auto& m : maps_) out.push_back(m.get());
  return out;
}

}  // namespace ss::gpu
