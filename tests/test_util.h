// Helpers shared by tests: scratch folders and model files made on the fly.
#pragma once

#include <string>

namespace tandem::test {

// A fresh folder under the system temp dir, removed when the process exits.
std::string temp_dir();

// Path of a GGUF file with the given preset and seed, made once per process; `f16` stores
// matrices and embeddings in half precision, `tied` leaves out output.weight.
std::string model_file(const std::string& preset = "tiny", unsigned seed = 1, bool f16 = false, bool tied = false);

}  // namespace tandem::test
