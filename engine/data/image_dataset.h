// Image datasets for vision models: IDX files (the MNIST / Fashion-MNIST
// format) read whole into memory, split into a training and a test set.
//
// IDX layout (big-endian): a 4-byte magic 0x00 0x00 <type> <dims>, then <dims>
// 4-byte sizes, then the payload, row-major. Only unsigned bytes (type 0x08)
// are read: images are 0x00000803 (count, rows, cols) and labels 0x00000801
// (count). A file may be gzip-compressed (the usual `.gz` download) or plain;
// both are read through zlib's gzread, which passes plain files through.
//
// Every check is done before the data is trusted: the magic, the payload being
// exactly the size the header declares (a truncated or over-long file is an
// error, not silently short or padded data), label and image counts agreeing,
// labels below the class count. Memory grows with the bytes actually read, so
// a corrupt header claiming 2^32 images fails on the file's real size instead
// of allocating first.
//
// Shape legend: N images, H rows, W columns, C channels (1 for IDX).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;  // u8, 3 dims
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;  // u8, 1 dim
// Where Debian's dataset-fashion-mnist package installs the four files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionMnistClasses = 10;
// Labels are bytes, so no IDX label file can name more classes than this.
inline constexpr int kMaxIdxClasses = 256;

// The payload of an IDX image file, as read.
struct IdxImages {
  std::string path;
  std::int64_t count = 0;            // N
  int rows = 0;                      // H
  int cols = 0;                      // W
  std::vector<std::uint8_t> pixels;  // (N, H, W)
};

// The payload of an IDX label file, as read.
struct IdxLabels {
  std::string path;
  std::int64_t count = 0;            // N
  std::vector<std::uint8_t> labels;  // (N)
};

// Reads one IDX file (gzipped or plain). Errors name the file and the fix:
// missing, a directory, unreadable, corrupt gzip, wrong magic (another type or
// number of dimensions, e.g. a label file passed as images), an empty shape,
// a payload shorter or longer than the header declares, and for labels one not
// below `classes` (1..256).
Result<IdxImages> read_idx_images(const std::string& path);
Result<IdxLabels> read_idx_labels(const std::string& path, int classes = kMaxIdxClasses);

// One split: images with their labels, pixels as stored (0..255).
struct ImageSet {
  std::int64_t count = 0;            // N
  int rows = 0;                      // H
  int cols = 0;                      // W
  int channels = 1;                  // C
  int classes = 0;                   // labels lie in [0, classes)
  std::vector<std::uint8_t> pixels;  // (N, H, W, C) row-major
  std::vector<std::uint8_t> labels;  // (N)
  std::string images_path;
  std::string labels_path;

  std::size_t image_size() const {  // H·W·C bytes per image
    return static_cast<std::size_t>(rows) * cols * channels;
  }
  std::span<const std::uint8_t> image(std::int64_t i) const {  // (H, W, C)
    return std::span(pixels).subspan(static_cast<std::size_t>(i) * image_size(), image_size());
  }
};

// Per-channel mean and standard deviation of a set's pixels scaled to [0, 1],
// computed exactly from the data (integer sums), so another dataset or a
// subset gets its own figures rather than Fashion-MNIST's constants. A
// channel whose pixels are all equal gets std 1: normalising only centres it.
struct PixelStats {
  std::vector<double> mean;  // (C)
  std::vector<double> std;   // (C)
};
PixelStats pixel_stats(const ImageSet& set);

struct ImageDataset {
  std::string dir;  // the directory the files were read from
  ImageSet train;
  ImageSet test;
  PixelStats stats;  // of train; normalise both sets with it
};

// `name_or_dir` is "fashion-mnist" (kFashionMnistDir, 10 classes) or a
// directory in the MNIST layout holding train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte,
// each plain or with `.gz` (the plain one is read when both are there).
// `classes` is the label range the caller expects; 0 takes fashion-mnist's 10,
// or for a directory max label + 1 over both splits. Both splits get the same
// `classes` and must share one image size. Missing files are named, with how
// to get them.
Result<ImageDataset> load_image_dataset(const std::string& name_or_dir, int classes = 0);

// Whether `name_or_dir` is what load_image_dataset reads rather than a file
// of tokens: the name fashion-mnist (unless a regular file has that name), or
// a directory holding any of the four IDX files. Reads no file.
bool names_image_dataset(const std::string& name_or_dir);

// Checks a set's images are the size a model takes. The error names both
// sizes (H×W×C) and the fix.
Status check_image_shape(const ImageSet& set, int rows, int cols, int channels);

}  // namespace meshtrain
