// The user-facing binaries on broken checkpoints: one clear error naming the file, tensor or
// field, a non-zero exit status, no crash.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/run_command.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
using testing_util::TempDir;

constexpr char kTiny[] = "tests/data/tiny-a";

using Run = testing_util::CommandResult;

Run RunCommand(const std::string& cmd) { return testing_util::RunCommand(cmd + " 2>&1"); }

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Copies tiny-a's config and rewrites its weights through `edit` (which may drop, retype or
// reshape tensors).
template <typename Edit>
void RewriteCheckpoint(const TempDir& dir, Edit edit) {
  fs::copy_file(std::string(kTiny) + "/config.json", dir / "config.json");
  auto ckpt = Checkpoint::Open(kTiny);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<TensorToWrite> out;
  for (const auto& [name, v] : (*ckpt)->tensors()) {
    TensorToWrite t{name, v->dtype, v->shape, std::vector<uint8_t>(v->data, v->data + v->nbytes)};
    if (edit(t)) out.push_back(std::move(t));
  }
  ASSERT_TRUE(WriteSafetensors(dir / "model.safetensors", out).ok());
}

void CopyTiny(const TempDir& dir) {
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(std::string(kTiny) + "/" + f, dir / f);
  }
}

// Both binaries must fail cleanly with a message containing every one of `needles`.
void ExpectCleanFailure(const TempDir& dir, const std::vector<std::string>& needles) {
  for (const std::string& cmd :
       {std::string(SS_BIN_DIR "/splitserve-generate --max_new_tokens 1 --model ") + dir.path(),
        std::string(SS_BIN_DIR "/splitserve-golden --golden tests/data/tiny-a --model ") +
            dir.path()}) {
    const Run r = RunCommand(cmd);
    EXPECT_GT(r.status, 0) << cmd << "\n" << r.output;
    EXPECT_LT(r.status, 128) << "crashed: " << cmd << "\n" << r.output;
    for (const std::string& n : needles) {
      EXPECT_NE(r.output.find(n), std::string::npos) << "'" << n << "' not in: " << r.output;
    }
  }
}

TEST(CliErrorsTest, TruncatedFile) {
  TempDir dir("ss_cli");
  CopyTiny(dir);
  std::vector<uint8_t> b = ReadAll(dir / "model.safetensors");
  b.resize(b.size() / 2);
  WriteAll(dir / "model.safetensors", b);
  ExpectCleanFailure(dir, {"model.safetensors"});
}

TEST(CliErrorsTest, CorruptedHeader) {
  TempDir dir("ss_cli");
  CopyTiny(dir);
  std::vector<uint8_t> b = ReadAll(dir / "model.safetensors");
  for (size_t i = 20; i < 60; ++i) b[i] = '#';
  WriteAll(dir / "model.safetensors", b);
  ExpectCleanFailure(dir, {"model.safetensors"});
}

TEST(CliErrorsTest, HeaderLengthBeyondFile) {
  TempDir dir("ss_cli");
  CopyTiny(dir);
  std::vector<uint8_t> b = ReadAll(dir / "model.safetensors");
  b[6] = 0x7f;  // header length field: ~2^55 bytes
  WriteAll(dir / "model.safetensors", b);
  ExpectCleanFailure(dir, {"model.safetensors"});
}

TEST(CliErrorsTest, OffsetsOutOfBounds) {
  TempDir dir("ss_cli");
  CopyTiny(dir);
  const std::vector<uint8_t> b = ReadAll(dir / "model.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[i]) << (8 * i);
  nlohmann::json h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + n);
  auto& off = h["layers.3.attn.attn_sink"]["data_offsets"];
  off[1] = off[1].get<uint64_t>() + (uint64_t{1} << 40);
  std::string header = h.dump();
  while (header.size() % 8) header.push_back(' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), b.begin() + 8 + n, b.end());
  WriteAll(dir / "model.safetensors", out);
  ExpectCleanFailure(dir, {"model.safetensors", "layers.3.attn.attn_sink"});
}

TEST(CliErrorsTest, MissingTensor) {
  TempDir dir("ss_cli");
  RewriteCheckpoint(dir, [](TensorToWrite& t) { return t.name != "layers.2.attn.wkv.scale"; });
  ExpectCleanFailure(dir, {"layers.2.attn.wkv.scale", "missing"});
}

TEST(CliErrorsTest, WrongDtype) {
  TempDir dir("ss_cli");
  RewriteCheckpoint(dir, [](TensorToWrite& t) {
    if (t.name == "layers.1.attn.attn_sink") {  // F32 [4] rewritten as BF16 [4]
      t.dtype = DType::kBF16;
      t.bytes.resize(t.bytes.size() / 2);
    }
    return true;
  });
  ExpectCleanFailure(dir, {"layers.1.attn.attn_sink", "BF16", "F32"});
}

TEST(CliErrorsTest, WrongShape) {
  TempDir dir("ss_cli");
  RewriteCheckpoint(dir, [](TensorToWrite& t) {
    if (t.name == "norm.weight") {  // BF16 [dim] rewritten as [dim/2, 2]
      t.shape = {t.shape[0] / 2, 2};
    }
    return true;
  });
  ExpectCleanFailure(dir, {"norm.weight"});
}

TEST(CliErrorsTest, ConfigViolatesConstraint) {
  TempDir dir("ss_cli");
  CopyTiny(dir);
  std::ifstream in(dir / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  c["q_lora_rank"] = 100;  // not a multiple of 128
  std::ofstream(dir / "config.json", std::ios::trunc) << c.dump(2);
  ExpectCleanFailure(dir, {"q_lora_rank"});
}

// splitserve-golden --backend: an unknown name, or --experts without a backend, exits 2 with a
// message and runs no check. (--backend cuda where no device exists exits 2 the same way; that
// depends on the machine, so it is not asserted here.)
TEST(CliErrorsTest, GoldenBackendFlags) {
  for (const auto& [flags, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--backend tpu", "expected reference, cpu or cuda"},
           {"--experts 0-6=shm:x", "--experts needs --backend cpu or cuda"}}) {
    const ss::Run r = RunCommand(std::string(SS_BIN_DIR "/splitserve-golden --golden ") + kTiny +
                                 " --model " + kTiny + " " + flags);
    EXPECT_EQ(r.status, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(" checks, "), std::string::npos) << r.output;
  }
}

TEST(CliErrorsTest, MissingDirectory) {
  TempDir dir("ss_cli");
  ExpectCleanFailure(dir, {"config.json"});
}

}  // namespace
}  // namespace ss
