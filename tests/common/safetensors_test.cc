#include "common/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;

using testing_util::TempDir;

std::vector<uint8_t> Image(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + header.size());
  return out;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed = 1) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 7 * i);
  return b;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TensorToWrite T(std::string name, DType dtype, std::vector<int64_t> shape, uint8_t seed = 1) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {std::move(name), dtype, std::move(shape), Bytes(n * DTypeSize(dtype), seed)};
}

TEST(SafetensorsTest, DTypeNamesRoundTrip) {
  for (DType d : {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kF8E8M0, DType::kI8,
                  DType::kI64, DType::kI32, DType::kU8}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
    EXPECT_GT(DTypeSize(d), 0u);
  }
  EXPECT_FALSE(ParseDType("F16").ok());
  EXPECT_FALSE(ParseDType("bf16").ok());
}

TEST(SafetensorsTest, WriteThenReadRoundTrip) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  std::vector<TensorToWrite> ts = {T("z.first", DType::kF32, {2, 3}, 3),
                                   T("a.second", DType::kBF16, {5}, 9),
                                   T("empty", DType::kI64, {0, 4}), T("scalar", DType::kU8, {}, 5),
                                   T("m.codes", DType::kI8, {3, 1}, 200)};
  ASSERT_TRUE(WriteSafetensors(path, ts, {{"format", "pt"}}).ok());

  const std::vector<uint8_t> raw = ReadAll(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to 8 bytes";
  const std::string header(raw.begin() + 8, raw.begin() + 8 + n);
  EXPECT_LT(header.find("__metadata__"), header.find("z.first"));
  EXPECT_LT(header.find("z.first"), header.find("a.second")) << "tensors keep the given order";

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->tensors().size(), ts.size());
  EXPECT_EQ((*f)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const TensorToWrite& t : ts) {
    const TensorView* v = (*f)->Find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    EXPECT_EQ(v->file, path);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(std::vector<uint8_t>(v->data, v->data + v->nbytes), t.bytes) << t.name;
  }
  EXPECT_EQ((*f)->Find("z.first")->numel(), 6);
  EXPECT_EQ((*f)->Find("z.first")->ShapeString(), "[2, 3]");
  EXPECT_EQ((*f)->Find("scalar")->numel(), 1);
  EXPECT_EQ((*f)->Find("nope"), nullptr);

  // No metadata: no "__metadata__" key at all.
  ASSERT_TRUE(WriteSafetensors(path, {T("x", DType::kF32, {1})}).ok());
  const std::vector<uint8_t> raw2 = ReadAll(path);
  EXPECT_EQ(std::string(raw2.begin(), raw2.end()).find("__metadata__"), std::string::npos);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  TempDir dir;
  TensorToWrite bad = T("x", DType::kF32, {2, 2});
  bad.bytes.pop_back();
  EXPECT_FALSE(WriteSafetensors(dir / "a.safetensors", {bad}).ok());
  EXPECT_FALSE(
      WriteSafetensors(dir / "a.safetensors", {T("x", DType::kF32, {1}), T("x", DType::kF32, {1})})
          .ok());
  EXPECT_FALSE(WriteSafetensors(dir / "a.safetensors", {T("", DType::kF32, {1})}).ok());
  EXPECT_FALSE(WriteSafetensors(dir / "a.safetensors", {{"neg", DType::kF32, {-1}, {}}}).ok());
  EXPECT_FALSE(WriteSafetensors(dir / "no_such_dir/a.safetensors", {}).ok());
  // A name or metadata value that is not UTF-8 is refused, not written with replaced bytes.
  const absl::Status bad_name =
      WriteSafetensors(dir / "a.safetensors", {T("x\xff", DType::kF32, {1})});
  EXPECT_EQ(bad_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_name.message().find("UTF-8"), absl::string_view::npos) << bad_name;
  EXPECT_FALSE(
      WriteSafetensors(dir / "a.safetensors", {T("x", DType::kF32, {1})}, {{"k", "\xc3"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "a.safetensors"));
}

TEST(SafetensorsTest, OpenMissingFileIsNotFound) {
  auto f = SafetensorsFile::Open("tests/data/does-not-exist.safetensors");
  EXPECT_TRUE(absl::IsNotFound(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("does-not-exist"), absl::string_view::npos);
}

TEST(SafetensorsTest, EmptyHeaderAndEmptyTensorsAreValid) {
  auto img = Image("{}", {});
  EXPECT_TRUE(SafetensorsFile::FromBuffer(img.data(), img.size(), "x").ok());
  img = Image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
              R"("b":{"dtype":"U8","shape":[0,3],"data_offsets":[0,0]},)"
              R"("c":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )",
              {1, 2});
  auto f = SafetensorsFile::FromBuffer(img.data(), img.size(), "x");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 3u);
}

struct BadCase {
  const char* what;
  std::vector<uint8_t> image;
  const char* message;  // a substring the error must contain
};

std::vector<BadCase> BadCases() {
  const std::vector<uint8_t> d64 = Bytes(64);
  auto one = [&](const std::string& entry) {
    return Image(std::string(R"({"a.weight":)") + entry + "}", d64);
  };
  std::vector<uint8_t> huge_len = Image("{}", {});
  huge_len[7] = 0x7f;
  std::vector<uint8_t> over_limit = Image("{}", {});
  const uint64_t n = (100ull << 20) + 1;
  for (int i = 0; i < 8; ++i) over_limit[i] = static_cast<uint8_t>(n >> (8 * i));
  std::vector<uint8_t> beyond =
      Image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", {7});
  beyond[0] += 2;  // header length 2 bytes past the end
  std::vector<uint8_t> cut = one(R"({"dtype":"F32","shape":[16],"data_offsets":[0,64]})");
  cut.resize(cut.size() - 1);

  return {
      {"empty file", {}, "too short"},
      {"truncated length", {1, 0, 0}, "too short"},
      {"header length beyond file", beyond, "exceeds the file"},
      {"header length huge", huge_len, "exceeds the 100 MB limit"},
      {"header length over 100 MB", over_limit, "header length 104857601 exceeds the 100 MB limit"},
      {"truncated data", cut, "exceed the data section (63 bytes)"},
      {"malformed JSON", Image(R"({"a.weight": {"dtype": )", d64), "well-formed"},
      {"trailing garbage", Image(R"({} x)", d64), "well-formed"},
      {"header not object", Image("[1, 2]", d64), "not a JSON object"},
      {"entry not object", one("[0, 4]"), "'a.weight': header entry is not an object"},
      {"missing shape", one(R"({"dtype":"F32","data_offsets":[0,4]})"), "'a.weight'"},
      {"unknown dtype", one(R"({"dtype":"Q4","shape":[1],"data_offsets":[0,1]})"),
       "unknown dtype 'Q4'"},
      {"dtype not string", one(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})"),
       "dtype is not a string"},
      {"shape not array", one(R"({"dtype":"U8","shape":4,"data_offsets":[0,4]})"),
       "shape is not an array"},
      {"negative shape", one(R"({"dtype":"U8","shape":[-4],"data_offsets":[0,4]})"),
       "shape entry -4"},
      {"float shape", one(R"({"dtype":"U8","shape":[4.0],"data_offsets":[0,4]})"),
       "not a non-negative integer"},
      {"string shape", one(R"({"dtype":"U8","shape":["4"],"data_offsets":[0,4]})"),
       "not a non-negative integer"},
      {"shape beyond int64",
       one(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,4]})"),
       "not a non-negative integer"},
      {"shape product overflow",
       one(R"({"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})"),
       "overflows"},
      {"shape bytes overflow",
       one(R"({"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]})"), "overflows"},
      {"offsets out of bounds", one(R"({"dtype":"U8","shape":[100],"data_offsets":[0,100]})"),
       "tensor 'a.weight': data_offsets [0, 100] exceed the data section (64 bytes)"},
      {"offsets huge", one(R"({"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]})"),
       "begin > end"},
      {"begin > end", one(R"({"dtype":"U8","shape":[0],"data_offsets":[8,4]})"), "begin > end"},
      {"offsets wrong count", one(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})"),
       "two non-negative integers"},
      {"negative offset", one(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})"),
       "two non-negative integers"},
      {"size mismatch", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,12]})"),
       "hold 12 bytes but F32 [4] needs 16"},
      {"overlap",
       Image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
             d64),
       "overlap tensor 'a'"},
      {"identical ranges",
       Image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
             d64),
       "overlap"},
      {"duplicate key",
       Image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
             R"("a":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
             d64),
       "'a' appears twice"},
      {"metadata not object", Image(R"({"__metadata__":[1]})", d64), "__metadata__"},
      {"metadata value not string", Image(R"({"__metadata__":{"format":1}})", d64),
       "'format' is not a string"},
      {"empty name", Image(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", d64),
       "empty tensor name"},
  };
}

TEST(SafetensorsTest, HeaderErrorsNameFileAndTensor) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.what);
    auto f = SafetensorsFile::FromBuffer(c.image.data(), c.image.size(), "tests/x.safetensors");
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
    EXPECT_NE(f.status().message().find("tests/x.safetensors: "), absl::string_view::npos)
        << f.status();
    EXPECT_NE(f.status().message().find(c.message), absl::string_view::npos) << f.status();
  }
}

TEST(SafetensorsTest, OpenReportsHeaderErrorsFromDisk) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  std::vector<uint8_t> img =
      Image(R"({"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", Bytes(8));
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(img.data()), img.size());
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path + ": tensor 'a'"), absl::string_view::npos)
      << f.status();
  std::ofstream(path, std::ios::binary | std::ios::trunc);  // empty file: no mapping at all
  EXPECT_TRUE(absl::IsInvalidArgument(SafetensorsFile::Open(path).status()));
  EXPECT_FALSE(SafetensorsFile::Open(dir.path()).ok()) << "a directory is not a file";
}

TEST(SafetensorsTest, CheckpointGetChecksDtypeAndShape) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "model.safetensors",
                               {T("w", DType::kF8E4M3, {4, 8}), T("b", DType::kF32, {4})})
                  .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.num_files(), 1u);
  EXPECT_EQ(c.tensors().size(), 2u);

  auto ok = c.Get("w", DType::kF8E4M3, {4, 8});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->nbytes, 32u);

  auto missing = c.Get("x", DType::kF32, {4});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_EQ(missing.status().message(), dir.path() + ": missing tensor 'x'");

  auto dtype = c.Get("b", DType::kBF16, {4});
  EXPECT_TRUE(absl::IsInvalidArgument(dtype.status()));
  EXPECT_EQ(dtype.status().message(),
            "b in " + (dir / "model.safetensors") + ": dtype F32, expected BF16");

  auto shape = c.Get("w", DType::kF8E4M3, {8, 4});
  EXPECT_TRUE(absl::IsInvalidArgument(shape.status()));
  EXPECT_EQ(shape.status().message(),
            "w in " + (dir / "model.safetensors") + ": shape [4, 8], expected [8, 4]");

  auto any = c.GetAnyShape("w", DType::kF8E4M3);
  ASSERT_TRUE(any.ok());
  EXPECT_FALSE(c.GetAnyShape("w", DType::kI8).ok());
}

TEST(SafetensorsTest, CheckpointWithoutIndexOpensModelFilesSorted) {
  TempDir dir;
  ASSERT_TRUE(
      WriteSafetensors(dir / "model-00002-of-00002.safetensors", {T("b", DType::kU8, {2})}).ok());
  ASSERT_TRUE(
      WriteSafetensors(dir / "model-00001-of-00002.safetensors", {T("a", DType::kU8, {2})}).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "golden.safetensors", {T("g", DType::kU8, {2})}).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 2u);
  EXPECT_NE((*ckpt)->Find("a"), nullptr);
  EXPECT_NE((*ckpt)->Find("b"), nullptr);
  EXPECT_EQ((*ckpt)->Find("g"), nullptr) << "only model*.safetensors";

  // The same name in two files.
  ASSERT_TRUE(WriteSafetensors(dir / "model-00003.safetensors", {T("a", DType::kU8, {2})}).ok());
  auto dup = Checkpoint::Open(dir.path());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("tensor 'a' is in both"), absl::string_view::npos)
      << dup.status();
  EXPECT_FALSE(Checkpoint::OpenFiles(
                   {dir / "model-00001-of-00002.safetensors", dir / "model-00003.safetensors"})
                   .ok());
}

TEST(SafetensorsTest, CheckpointOpenErrors) {
  TempDir dir;
  auto none = Checkpoint::Open(dir.path());
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_EQ(none.status().message(), "no model*.safetensors in " + dir.path());
  EXPECT_TRUE(absl::IsNotFound(Checkpoint::Open(dir / "missing").status()));
  EXPECT_TRUE(absl::IsNotFound(Checkpoint::OpenFiles({dir / "missing.safetensors"}).status()));
}

TEST(SafetensorsTest, OpenFilesOpensExactlyThose) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir / "golden.safetensors", {T("g", DType::kU8, {2})}).ok());
  ASSERT_TRUE(WriteSafetensors(dir / "other.safetensors", {T("o", DType::kU8, {2})}).ok());
  auto ckpt = Checkpoint::OpenFiles({dir / "golden.safetensors"});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 1u);
  EXPECT_EQ((*ckpt)->tensors().size(), 1u);
  EXPECT_TRUE(absl::IsNotFound((*ckpt)->Get("o", DType::kU8, {2}).status()));
}

class SafetensorsShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(WriteSafetensors(
                    dir_ / "model-00001-of-00002.safetensors",
                    {T("embed.weight", DType::kBF16, {4, 2}), T("layers.0.w", DType::kF32, {3})})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(
                    dir_ / "model-00002-of-00002.safetensors",
                    {T("layers.1.w", DType::kF32, {3}), T("head.weight", DType::kBF16, {4, 2})})
                    .ok());
  }
  void WriteIndex(const std::map<std::string, std::string>& weight_map) {
    std::string text = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    bool first = true;
    for (const auto& [t, f] : weight_map) {
      text += (first ? "\"" : ", \"") + t + "\": \"" + f + "\"";
      first = false;
    }
    std::ofstream(dir_ / "model.safetensors.index.json") << text << "}}";
  }
  std::map<std::string, std::string> GoodMap() const {
    return {{"embed.weight", "model-00001-of-00002.safetensors"},
            {"layers.0.w", "model-00001-of-00002.safetensors"},
            {"layers.1.w", "model-00002-of-00002.safetensors"},
            {"head.weight", "model-00002-of-00002.safetensors"}};
  }
  std::string Error() const {
    auto c = Checkpoint::Open(dir_.path());
    return c.ok() ? "OK" : std::string(c.status().message());
  }
  TempDir dir_;
};

TEST_F(SafetensorsShardedTest, OpensEveryShard) {
  // A stray model file next to the index is not opened: the index is authoritative.
  ASSERT_TRUE(
      WriteSafetensors(dir_ / "model-stray.safetensors", {T("stray", DType::kU8, {1})}).ok());
  WriteIndex(GoodMap());
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 2u);
  EXPECT_EQ((*ckpt)->tensors().size(), 4u);
  auto head = (*ckpt)->Get("head.weight", DType::kBF16, {4, 2});
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->file, dir_ / "model-00002-of-00002.safetensors");
  EXPECT_EQ((*ckpt)->Find("stray"), nullptr);
}

TEST_F(SafetensorsShardedTest, MissingShard) {
  auto m = GoodMap();
  m["layers.1.w"] = "model-00003-of-00003.safetensors";
  WriteIndex(m);
  auto c = Checkpoint::Open(dir_.path());
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
  EXPECT_NE(Error().find("shard 'model-00003-of-00003.safetensors' is missing"), std::string::npos)
      << Error();
}

TEST_F(SafetensorsShardedTest, TensorListedUnderWrongShard) {
  auto m = GoodMap();
  m["layers.1.w"] = "model-00001-of-00002.safetensors";
  WriteIndex(m);
  EXPECT_NE(Error().find("tensor 'layers.1.w' is listed under 'model-00001-of-00002.safetensors' "
                         "but it is in"),
            std::string::npos)
      << Error();
}

TEST_F(SafetensorsShardedTest, TensorInIndexButInNoShard) {
  auto m = GoodMap();
  m["norm.weight"] = "model-00002-of-00002.safetensors";
  WriteIndex(m);
  EXPECT_NE(Error().find("'norm.weight' is listed under 'model-00002-of-00002.safetensors' but no "
                         "shard holds it"),
            std::string::npos)
      << Error();
}

TEST_F(SafetensorsShardedTest, ShardTensorMissingFromIndex) {
  auto m = GoodMap();
  m.erase("head.weight");
  WriteIndex(m);
  EXPECT_NE(Error().find("1 tensor(s) not in the index: head.weight"), std::string::npos)
      << Error();
}

TEST_F(SafetensorsShardedTest, DuplicateAcrossShards) {
  ASSERT_TRUE(
      WriteSafetensors(dir_ / "model-00002-of-00002.safetensors",
                       {T("layers.1.w", DType::kF32, {3}), T("head.weight", DType::kBF16, {4, 2}),
                        T("layers.0.w", DType::kF32, {3})})
          .ok());
  WriteIndex(GoodMap());
  EXPECT_NE(Error().find("tensor 'layers.0.w' is in both"), std::string::npos) << Error();
}

TEST_F(SafetensorsShardedTest, MalformedIndex) {
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": [";
  EXPECT_NE(Error().find("not a JSON object"), std::string::npos) << Error();
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"metadata\": {}}";
  EXPECT_NE(Error().find("no 'weight_map'"), std::string::npos) << Error();
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"a": 3}})";
  EXPECT_NE(Error().find("'a' maps to 3"), std::string::npos) << Error();
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"a": "../x"}})";
  EXPECT_NE(Error().find("not a file name"), std::string::npos) << Error();
}

// Mutates a small valid image many times; every result must be a clean OK or error, and every
// view of an accepted image must lie inside the buffer.
TEST(SafetensorsFuzzTest, MutatedImagesNeverCrash) {
  TempDir dir;
  const std::string path = dir / "seed.safetensors";
  ASSERT_TRUE(WriteSafetensors(path,
                               {T("layers.0.attn.wq_a.weight", DType::kF8E4M3, {4, 8}),
                                T("layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 1}),
                                T("norm.weight", DType::kBF16, {8}), T("bias", DType::kF32, {3}),
                                T("tid2eid", DType::kI64, {2, 2}), T("empty", DType::kI32, {0})},
                               {{"format", "pt"}})
                  .ok());
  const std::vector<uint8_t> seed = ReadAll(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, seed.data(), 8);
  const std::string json(seed.begin() + 8, seed.begin() + 8 + header_len);
  const std::vector<uint8_t> data(seed.begin() + 8 + header_len, seed.end());
  ASSERT_TRUE(SafetensorsFile::FromBuffer(seed.data(), seed.size(), "seed").ok());

  static constexpr const char* kTokens[] = {"{",
                                            "}",
                                            "[",
                                            "]",
                                            ",",
                                            ":",
                                            "\"",
                                            "-",
                                            "0",
                                            "-1",
                                            "1e3",
                                            "0.5",
                                            "null",
                                            "true",
                                            "18446744073709551615",
                                            "9223372036854775807",
                                            "4294967296",
                                            "\"F32\"",
                                            "\"I64\"",
                                            "\\u0000",
                                            "\"shape\"",
                                            "\"data_offsets\"",
                                            "\"dtype\"",
                                            "\"__metadata__\"",
                                            "\xff",
                                            " "};
  std::mt19937_64 rng(0x5afe7e45);
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  int accepted = 0, rejected = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> img;
    const int kind = static_cast<int>(rng() % 7);
    if (kind <= 2) {  // raw byte damage anywhere, including the length field
      img = seed;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = pick(img.size());
        if (kind == 0) img[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        if (kind == 1) img[at] = static_cast<uint8_t>(rng());
        if (kind == 2) img.resize(pick(img.size() + 1));
        if (img.empty()) break;
      }
    } else if (kind == 3) {  // header-length field
      img = seed;
      static constexpr uint64_t kLens[] = {0, 1, 7, 8, ~0ull, 1ull << 63, 100ull << 20};
      uint64_t n = rng() % 2 ? kLens[pick(std::size(kLens))] : header_len + (rng() % 33) - 16;
      for (int i = 0; i < 8; ++i) img[i] = static_cast<uint8_t>(n >> (8 * i));
    } else {  // JSON-level edits, with the length field kept consistent (mostly)
      std::string h = json;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        const size_t at = pick(h.size() + 1);
        if (kind == 4) {  // splice a slice of the header elsewhere
          const size_t from = pick(h.size()), len = pick(h.size() - from + 1);
          h.insert(at, h.substr(from, len));
        } else if (kind == 5) {  // replace a slice by a token
          h.replace(at, pick(8), kTokens[pick(std::size(kTokens))]);
        } else {  // delete a slice
          h.erase(at, pick(16));
        }
      }
      std::vector<uint8_t> d = data;
      if (rng() % 4 == 0) d.resize(pick(d.size() + 1));
      img = Image(h, d);
      if (rng() % 8 == 0) img[0] ^= static_cast<uint8_t>(rng());
    }

    // An exactly sized heap copy, so a sanitizer build catches any read past the end.
    std::unique_ptr<uint8_t[]> buf(new uint8_t[img.size() + 1]);
    std::memcpy(buf.get(), img.data(), img.size());
    auto f = SafetensorsFile::FromBuffer(buf.get(), img.size(), "fuzz");
    if (!f.ok()) {
      ++rejected;
      EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
      continue;
    }
    ++accepted;
    for (const auto& [name, v] : (*f)->tensors()) {
      ASSERT_GE(v.data, buf.get() + 8);
      ASSERT_LE(v.data + v.nbytes, buf.get() + img.size());
      ASSERT_EQ(v.nbytes, static_cast<size_t>(v.numel()) * DTypeSize(v.dtype));
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 10000);
  EXPECT_LT(secs, 10.0);
  std::printf("fuzz: %d accepted, %d rejected in %.2f s\n", accepted, rejected, secs);
}

}  // namespace
}  // namespace ss
