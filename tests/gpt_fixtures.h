#pragma once
// The small GPT the model tests build: 3 layers, 4 heads, embed 32, a 50-token
// vocabulary and 16 positions; a few thousand parameters, a step in milliseconds.

#include "worker/model/gpt.h"

namespace batchdist::worker {

inline GptShape smallGptShape(double dropout = 0.0, bool recompute = false) {
  GptShape s;
  s.layers = 3;
  s.heads = 4;
  s.embed = 32;
  s.vocab = 50;
  s.seq_len = 16;
  s.dropout = dropout;
  s.recompute = recompute;
  return s;
}

}  // namespace batchdist::worker
