// The expert store in a shared-memory segment (common/expert_store_format.h) as the GPU worker
// sees it (gpu_worker/expert_store_map.h): a store loaded into a segment from a generated
// checkpoint opens read-only with every expert's six pieces byte-equal to the store's views and
// to an anonymous store of the same options (slices 0/2 and 1/2, row-major and tiles of 16); the
// segment goes with the store; ExpertStoreSet's streamable layers and reasons; the refusals (no
// segment, bad magic, version, incomplete, a geometry that is not the model's, a dead owner's
// leftover) and the leftover's reclaim by the next store of the name.
#include "gpu_worker/expert_store_map.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/expert_store_format.h"
#include "common/thread_pool.h"
#include "cpu_expert_worker/expert_store.h"
#include "tests/cpu_expert_worker/expert_test_util.h"

namespace ss::gpu {
namespace {

using expert::ExpertStore;
using expert::ExpertStoreOptions;
using expert::testing_util::I256Checkpoint;

std::string Name(const std::string& tag) {
  return "ss-test-store-" + tag + "-" + std::to_string(::getpid());
}

bool SegmentExists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> Load(std::vector<int> layers, int i, int n,
                                                  int64_t tile_rows, const std::string& shm,
                                                  ThreadPool* pool = nullptr) {
  ExpertStoreOptions o;
  o.source.model_dir = I256Checkpoint();
  o.layers = std::move(layers);
  o.slice_index = i;
  o.slice_count = n;
  o.tile_rows = tile_rows;
  o.shm_name = shm;
  return ExpertStore::Load(o, pool);
}

// Byte i of the segment `name`, read and written through a second read-write mapping (a test's
// way to corrupt a store).
class SegmentEditor {
 public:
  explicit SegmentEditor(const std::string& name) {
    const int fd = ::shm_open(absl::StrCat("/", name).c_str(), O_RDWR, 0);
    EXPECT_GE(fd, 0) << name;
    struct stat st;
    ::fstat(fd, &st);
    size_ = st.st_size;
    base_ =
        static_cast<uint8_t*>(::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
  }
  ~SegmentEditor() { ::munmap(base_, size_); }
  ExpertStoreHeader* header() { return reinterpret_cast<ExpertStoreHeader*>(base_); }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

void ExpectSameBytes(const uint8_t* a, const uint8_t* b, int64_t n, const std::string& what) {
  EXPECT_EQ(std::memcmp(a, b, n), 0) << what;
}

TEST(ExpertStoreMap, SharedStoreOpensWithEveryPieceEqualToTheStore) {
  ThreadPoolOptions po;
  po.num_threads = 2;
  auto pool = *ThreadPool::Create(po);
  for (int slice = 0; slice < 2; ++slice) {
    for (int64_t tile_rows : {0, 16}) {
      SCOPED_TRACE(testing::Message() << "slice " << slice << "/2, tile_rows " << tile_rows);
      const std::string name = Name("views");
      const std::string seg = ExpertStoreSegmentName(name);
      EXPECT_EQ(seg, name + "-store");
      auto shared = Load({4, 0, 5}, slice, 2, tile_rows, seg, pool.get());
      ASSERT_TRUE(shared.ok()) << shared.status();
      EXPECT_EQ((*shared)->shm_name(), absl::StrCat("/", seg));
      auto anon = Load({4, 0, 5}, slice, 2, tile_rows, "", pool.get());
      ASSERT_TRUE(anon.ok()) << anon.status();
      EXPECT_EQ((*anon)->shm_name(), "");
      const ModelConfig& c = (*shared)->config();
      auto map = ExpertStoreMap::Open(seg, c);
      ASSERT_TRUE(map.ok()) << map.status();
      const StoreExpertLayout& l = (*map)->layout();
      EXPECT_EQ(l.dim, c.dim);
      EXPECT_EQ(l.inter, c.moe_inter_dim);
      EXPECT_EQ(l.inter_slice, c.moe_inter_dim / 2);
      EXPECT_EQ(l.slice_index, slice);
      EXPECT_EQ(l.slice_count, 2);
      EXPECT_EQ(l.tile_rows, tile_rows);
      EXPECT_EQ(l.num_experts, c.n_routed_experts);
      EXPECT_EQ(l.w2_stride, l.inter_slice / 2);
      EXPECT_EQ(l.w2_scale_stride, l.inter_slice / 32);
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*map)->data()) % 4096, 0u);
      EXPECT_EQ((*map)->size() % 4096, 0u);
      EXPECT_EQ((*map)->expert(1, 0), nullptr);  // not held
      EXPECT_EQ((*map)->expert(4, c.n_routed_experts), nullptr);
      const int64_t dim = l.dim, is = l.inter_slice;
      const int64_t w13 = is * dim / 2, w13s = is * dim / 32, w2 = dim * is / 2,
                    w2s = dim * is / 32;
      int64_t compared = 0;
      for (int layer : {4, 0, 5}) {
        const expert::ExpertSliceView* sv = (*shared)->layer_views(layer);
        const expert::ExpertSliceView* av = (*anon)->layer_views(layer);
        for (int64_t e = 0; e < l.num_experts; ++e) {
          const uint8_t* b = (*map)->expert(layer, e);
          ASSERT_NE(b, nullptr);
          ASSERT_GE(b, (*map)->data());
          ASSERT_LE(b + l.expert_stride, (*map)->data() + (*map)->size());
          const std::string at = "layer " + std::to_string(layer) + " expert " + std::to_string(e);
          const uint8_t* pieces[6] = {b + l.w1,       b + l.w1_scale, b + l.w3,
                                      b + l.w3_scale, b + l.w2,       b + l.w2_scale};
          const uint8_t* store[6] = {sv[e].w1,       sv[e].w1_scale, sv[e].w3,
                                     sv[e].w3_scale, sv[e].w2,       sv[e].w2_scale};
          const uint8_t* anonv[6] = {av[e].w1,       av[e].w1_scale, av[e].w3,
                                     av[e].w3_scale, av[e].w2,       av[e].w2_scale};
          const int64_t bytes[6] = {w13, w13s, w13, w13s, w2, w2s};
          for (int p = 0; p < 6; ++p) {
            ExpectSameBytes(pieces[p], store[p], bytes[p], at + " piece " + std::to_string(p));
            ExpectSameBytes(pieces[p], anonv[p], bytes[p],
                            at + " piece " + std::to_string(p) + " (anonymous store)");
            compared += bytes[p];
          }
        }
      }
      EXPECT_EQ(compared, (*shared)->slice_bytes());
      shared->reset();  // unlinks; the map's pages stay until it goes
      EXPECT_FALSE(SegmentExists(seg));
      EXPECT_EQ((*map)->expert(4, 1)[0], (*anon)->layer_views(4)[1].w1[0]);
      EXPECT_EQ(ExpertStoreMap::Open(seg, c).status().code(), absl::StatusCode::kNotFound);
    }
  }
}

TEST(ExpertStoreMap, MissingSegmentIsNotFound) {
  auto c = LoadModelConfig(I256Checkpoint());
  ASSERT_TRUE(c.ok());
  auto m = ExpertStoreMap::Open(Name("absent") + "-store", *c);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
}

TEST(ExpertStoreMap, CorruptOrMismatchingStoresAreRefused) {
  const std::string seg = ExpertStoreSegmentName(Name("corrupt"));
  auto store = Load({0, 1}, 0, 1, 0, seg);
  ASSERT_TRUE(store.ok()) << store.status();
  const ModelConfig c = (*store)->config();
  ASSERT_TRUE(ExpertStoreMap::Open(seg, c).ok());
  const auto refused = [&](const ModelConfig& model, const std::string& why) {
    auto m = ExpertStoreMap::Open(seg, model);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition)
        << why << ": " << m.status();
    EXPECT_NE(m.status().message().find(why), absl::string_view::npos) << m.status();
    EXPECT_NE(m.status().message().find("/dev/shm/" + seg), absl::string_view::npos) << m.status();
  };
  SegmentEditor edit(seg);
  ExpertStoreHeader* h = edit.header();
  h->magic ^= 1;
  refused(c, "magic");
  h->magic ^= 1;
  h->magic = 0;
  refused(c, "incomplete");
  h->magic = kExpertStoreMagic;
  h->format_version = kExpertStoreFormatVersion + 1;
  refused(c, "version");
  h->format_version = kExpertStoreFormatVersion;
  h->w2 += 64;
  refused(c, "piece offsets");
  h->w2 -= 64;
  ModelConfig other = c;
  other.dim *= 2;
  refused(other, "the model has");
  other = c;
  other.n_routed_experts += 1;
  refused(other, "the model has");
  other = c;
  other.n_layers = 1;
  other.n_mtp_layers = 0;
  refused(other, "holds layer 1");
  ASSERT_TRUE(ExpertStoreMap::Open(seg, c).ok());  // restored
}

TEST(ExpertStoreMap, DeadOwnersLeftoverIsRefusedAndReclaimed) {
  const std::string seg = ExpertStoreSegmentName(Name("dead"));
  auto store = Load({0}, 0, 1, 0, seg);
  ASSERT_TRUE(store.ok()) << store.status();
  const ModelConfig c = (*store)->config();
  // A live owner's name is not taken.
  auto twin = Load({0}, 0, 1, 0, seg);
  EXPECT_EQ(twin.status().code(), absl::StatusCode::kAlreadyExists) << twin.status();
  EXPECT_NE(twin.status().message().find(std::to_string(::getpid())), absl::string_view::npos)
      << twin.status();
  // Make the segment a dead process's leftover: its owner is a child that has exited.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  {
    SegmentEditor edit(seg);
    edit.header()->owner_pid = child;
    edit.header()->owner_start_time = 0;
  }
  auto m = ExpertStoreMap::Open(seg, c);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_NE(m.status().message().find("dead"), absl::string_view::npos) << m.status();
  // The next store of the name reclaims it; the old store's destructor leaves the new one be.
  auto fresh = Load({0, 2}, 0, 1, 0, seg);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  store->reset();
  EXPECT_TRUE(SegmentExists(seg));
  auto reopened = ExpertStoreMap::Open(seg, c);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_NE((*reopened)->expert(2, 0), nullptr);
  fresh->reset();
  EXPECT_FALSE(SegmentExists(seg));
}

TEST(ExpertStoreSet, StreamableLayersAndReasons) {
  const std::string a = Name("set-a"), b = Name("set-b");
  auto sa = Load({0, 1, 2}, 0, 2, 0, ExpertStoreSegmentName(a));
  ASSERT_TRUE(sa.ok()) << sa.status();
  auto sb = Load({0, 2}, 1, 2, 0, ExpertStoreSegmentName(b));
  ASSERT_TRUE(sb.ok()) << sb.status();
  const ModelConfig c = (*sa)->config();
  std::map<int64_t, ExpertLayerStores> layers;
  layers[0] = {{a, b}, 2};            // both slices in stores
  layers[1] = {{a, b}, 2};            // b does not hold layer 1
  layers[2] = {{a, ""}, 2};           // slice 1 over gRPC
  layers[3] = {{Name("nobody")}, 1};  // no such store
  layers[4] = {{}, 2};                // none of its slices is this rank's
  layers[5] = {{b}, 2};               // this rank's share: slice 1 alone
  auto set = ExpertStoreSet::Open(layers, c);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE((*set)->streamable(0));
  ASSERT_EQ((*set)->slices(0).size(), 2u);
  EXPECT_EQ((*set)->slices(0)[0]->layout().slice_index, 0);
  EXPECT_EQ((*set)->slices(0)[1]->layout().slice_index, 1);
  EXPECT_EQ((*set)->reason(0), "");
  EXPECT_FALSE((*set)->streamable(1));
  EXPECT_TRUE((*set)->slices(1).empty());
  EXPECT_NE((*set)->reason(1).find("does not hold"), std::string::npos) << (*set)->reason(1);
  EXPECT_FALSE((*set)->streamable(2));
  EXPECT_NE((*set)->reason(2).find("gRPC"), std::string::npos) << (*set)->reason(2);
  EXPECT_FALSE((*set)->streamable(3));
  EXPECT_NE((*set)->reason(3).find("no expert store"), std::string::npos) << (*set)->reason(3);
  EXPECT_TRUE((*set)->streamable(4));
  EXPECT_TRUE((*set)->slices(4).empty());
  EXPECT_FALSE((*set)->streamable(5));   // b holds layers 0 and 2 only
  EXPECT_EQ((*set)->maps().size(), 2u);  // each segment opened once
  EXPECT_FALSE((*set)->streamable(6));   // not given
  EXPECT_NE((*set)->reason(6), "");

  // A store whose slice count is not the layer's, or slices out of order: Open fails.
  std::map<int64_t, ExpertLayerStores> wrong_count = {{0, {{a}, 4}}};
  EXPECT_EQ(ExpertStoreSet::Open(wrong_count, c).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::map<int64_t, ExpertLayerStores> out_of_order = {{0, {{b, a}, 2}}};
  EXPECT_EQ(ExpertStoreSet::Open(out_of_order, c).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A corrupt store fails Open (it is not NotFound).
  {
    SegmentEditor edit(ExpertStoreSegmentName(a));
    edit.header()->format_version += 1;
  }
  EXPECT_EQ(ExpertStoreSet::Open(layers, c).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ss::gpu
