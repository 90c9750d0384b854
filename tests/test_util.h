// Helpers shared by tests: scratch folders and model files made on the fly.
#pragma once

#include <string>

namespace tandem::test {

// A fresh folder under the system temp dir, removed when the process exits.
std::string temp_dir();

// Path of a GGUF file with the given preset and seed, made once per process.
std::string model_file(const std::string& preset = "tiny", unsigned seed = 1);

}  // namespace tandem::test
