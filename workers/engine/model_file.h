// The model-file types the engine uses. They live in the model/ library because the
// scheduler reads the same GGUF metadata and vocabulary.
#pragma once

#include "model/gguf.h"
#include "model/half.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace tandem::engine {
using model::float_to_half;
using model::GgufFile;
using model::GgufTensor;
using model::GgufWriter;
using model::half_to_float;
using model::layer_tensor;
using model::ModelConfig;
using model::read_model_config;
using model::TensorType;
using model::Tokenizer;
}  // namespace tandem::engine
