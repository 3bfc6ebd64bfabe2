// Per-sequence decode state of the reference model (spec §4.1), reset for every new sequence.
//
// One LayerState per block (and per MTP block): the raw-KV window ring, the compressed main-KV
// entries, the indexer keys and the compressors' streaming partial state. A SequenceState is
// owned by one caller and mutated only by the forward call it is passed to.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace ss::model {

// Streaming state of one compressor: coff*ratio token slots of coff*d fp32 values each.
// Slots start as kv = 0, score = -inf (spec §3.7).
struct CompressorState {
  int64_t slots = 0, width = 0;
  std::vector<float> kv, score;  // [slots, width]
  void Reset(int64_t ratio, int64_t d) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    slots = coff * ratio;
    width = coff * d;
    kv.assign(slots * width, 0.0f);
    score.assign(slots * width, -std::numeric_limits<float>::infinity());
  }
};

struct LayerState {
  // Raw KV entries of the last `window` positions; slot = position mod window.
  std::vector<float> window;      // [window, head_dim]
  std::vector<float> compressed;  // [n_blocks, head_dim] main compressed KV
  std::vector<float> index_keys;  // [n_blocks, index_head_dim]
  CompressorState compressor, index_compressor;
};

struct SequenceState {
  int64_t next_pos = 0;            // position of the next token this sequence will consume
  std::vector<LayerState> layers;  // n_layers blocks, then the MTP blocks
};

}  // namespace ss::model
