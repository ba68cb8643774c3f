#pragma once
// model.name: gpt, a decoder-only transformer of GPT-2's shape.

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/config/config.h"
#include "worker/model/model.h"

namespace batchdist::worker {

/// Note [gpt]: GPT-2's decoder (Radford et al. 2019; nanoGPT's model.py):
///   tokens [N, T] (int64, T <= seq_len) -> wte(token) + wpe(position) -> dropout
///   -> `layers` pre-LayerNorm blocks:
///        x += dropout(c_proj(causal attention(c_attn(ln_1(x)))))   c_attn: E -> 3E
///        x += dropout(c_proj(gelu_tanh(c_fc(ln_2(x)))))            c_fc: E -> 4E
///   -> ln_f -> logits = h · wteᵀ [N, T, vocab] (the head is tied: no weight of its own).
/// Attention runs through compat::causalAttention (Note [causal attention]), with
/// dropout on its weights in training only. Parameters carry GPT-2's names
/// (wte, wpe, h.<i>.ln_1, .attn.c_attn, .attn.c_proj, .ln_2, .mlp.c_fc,
/// .mlp.c_proj, ln_f), but Linear's [out, in] layout: a Hugging Face GPT-2
/// checkpoint (Conv1D, [in, out]) loads transposed. Initialisation as GPT-2:
/// Linear and Embedding weights N(0, 0.02), biases 0, LayerNorm 1 and 0, and
/// the two residual projections of each block (attn.c_proj, mlp.c_proj)
/// N(0, 0.02 / sqrt(2 layers)), so the residual stream's variance does not grow
/// with depth. GPT-2 small (12 layers, 12 heads, embed 768, vocab 50257, seq_len
/// 1024) has 124,439,808 parameters.
/// It trains on data.name: tokens (Note [tokens] in worker/data/data.h) with the
/// language-model task (Note [language model] in worker/task/task.cc: per-token
/// cross-entropy over [N, T, vocab] against the next token); the config refuses it
/// with any other data (Note [task choice]), and forward refuses float samples.
struct GptShape {
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t embed = 64;
  int64_t vocab = 256;
  int64_t seq_len = 64;
  double dropout = 0.0;
  bool recompute = false;  ///< each block under Note [activation recompute]
};

/// The shape model.* asks for (layers, heads, embed, vocab, seq_len, dropout,
/// recompute).
GptShape gptShape(const ModelConfig& cfg);

/// The parameter count of a GPT of `shape` (tied head), computed from the shape
/// alone: the model checks its own against it when built, so that the count of a
/// model too large to build in a test (GPT-2 small's) is the model's.
int64_t gptParameterCount(const GptShape& shape);

/// Builds the GPT of `shape` on the CPU, initialised from the current torch seed.
/// Throws ConfigError when embed is not divisible by heads (the config checks it
/// first; this guards other callers).
std::unique_ptr<Model> buildGpt(const GptShape& shape);

}  // namespace batchdist::worker
