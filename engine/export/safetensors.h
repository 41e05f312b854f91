// The safetensors format (huggingface/safetensors, docs "Format"), written and
// read by our own code:
//
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object: per tensor {"dtype", "shape", "data_offsets":
//             [begin, end)} relative to the data, plus an optional
//             "__metadata__" object of string values; padded with spaces
//   the rest  the tensors' raw little-endian bytes, row-major
//
// The reader enforces what the format requires, so a damaged or hostile file
// is refused naming the tensor and the field: a header length past the end of
// the file, a header that is not a JSON object, an unknown dtype, a shape
// whose bytes differ from its offsets, offsets past the data, and byte ranges
// that overlap or leave a hole (the data must be exactly covered, so a file
// cannot carry anything beside its tensors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain {

// The element types meshtrain reads and writes (others are refused by name).
enum class SafeDType { f32, bf16, f16 };

std::string_view safe_dtype_name(SafeDType t);  // "F32", "BF16", "F16"
std::size_t safe_dtype_bytes(SafeDType t);

struct SafeTensor {
  std::string name;
  SafeDType dtype = SafeDType::f32;
  std::vector<std::int64_t> shape;
  std::string bytes;  // prod(shape) elements of dtype, little-endian
};

// The file's bytes: tensors in the given order, back to back, the header's
// keys in JSON order (sorted) and padded with spaces to a multiple of 8 bytes
// so the data starts aligned. The same tensors give the same bytes.
Result<std::string> encode_safetensors(const std::vector<SafeTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata);

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafeTensor> tensors;  // in the order of their data
};

// Parses and verifies a whole file's bytes; `path` names it in errors.
Result<SafetensorsFile> decode_safetensors(std::string_view file, const std::string& path);

// The tensor's values as fp32 (exact for every dtype above).
std::vector<float> to_float32(const SafeTensor& t);
// `values` as `dtype` bytes: bf16 and f16 round to nearest even (NaN stays NaN).
std::string from_float32(const std::vector<float>& values, SafeDType dtype);

}  // namespace meshtrain
