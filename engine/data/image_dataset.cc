#include "engine/data/image_dataset.h"

#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "core/host_memory.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFix =
    "re-install dataset-fashion-mnist (apt-get install --reinstall dataset-fashion-mnist) or "
    "point --data at a complete copy";
constexpr const char* kInstall =
    "install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (it puts the files in "
    "/usr/share/datasets/fashion-mnist) or point --data at a directory holding them";
constexpr std::array<const char*, 4> kMnistFiles = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"};
// Before a gzipped payload is read its size is unknown; reserving this many
// times the compressed size covers images (MNIST deflates about 5:1) without
// trusting the header, and the vector grows past it only with real data.
constexpr std::uint64_t kGzipReserveRatio = 8;

using GzHandle = std::unique_ptr<gzFile_s, int (*)(gzFile)>;

std::string describe_magic(std::uint32_t magic) {
  if (magic == kIdxImagesMagic) return "an IDX image file";
  if (magic == kIdxLabelsMagic) return "an IDX label file";
  if (magic >> 16 != 0) return "not an IDX file";
  return fmt::format("an IDX file of type {:#04x} with {} dimensions", (magic >> 8) & 0xff,
                     magic & 0xff);
}

// "60000 images of 28×28 = 47040000 bytes" / "60000 labels = 60000 bytes".
std::string describe_shape(const std::vector<std::uint32_t>& dims, std::uint64_t bytes) {
  if (dims.size() == 3) {
    return fmt::format("{} images of {}×{} = {} bytes", dims[0], dims[1], dims[2], bytes);
  }
  return fmt::format("{} labels = {} bytes", dims[0], bytes);
}

struct IdxFile {
  std::vector<std::uint32_t> dims;    // as the header declares them
  std::vector<std::uint8_t> payload;  // exactly the declared bytes
};

// Reads up to `n` bytes; fewer only at the end of the data. A gzip error
// (corrupt or cut-off compressed stream) is an error, not a short read.
Result<std::size_t> read_some(gzFile f, const std::string& path, void* buf, std::size_t n) {
  const int got = gzread(f, buf, static_cast<unsigned>(n));
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  // zlib flags a cut-off gzip stream with Z_BUF_ERROR but still returns 0, as at a clean end.
  if (got < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    if (err == Z_ERRNO) {
      return make_error("error reading '{}': {}; check the disk and its permissions", path,
                        std::strerror(errno));
    }
    // zlib prefixes its message with the path, which ours already names.
    std::string_view why = msg;
    if (why.starts_with(path + ": ")) why.remove_prefix(path.size() + 2);
    return make_error("'{}' is corrupt or cut-off gzip data ({}); {}", path, why, kFix);
  }
  return static_cast<std::size_t>(got);
}

Result<std::uint32_t> read_u32(gzFile f, const std::string& path) {
  unsigned char b[4];
  MT_ASSIGN(const std::size_t got, read_some(f, path, b, sizeof b));
  if (got != sizeof b) {
    return make_error("'{}' is truncated: it ends inside the IDX header; {}", path, kFix);
  }
  // IDX is big-endian whatever the host.
  return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
}

// The size of `path`, which must be a regular file, in bytes; `kind`
// ("image" or "label") words the messages.
Result<std::uint64_t> idx_file_bytes(const std::string& path, const char* kind) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return make_error("IDX {} file '{}' does not exist; {}", kind, path, kInstall);
  if (fs::is_directory(st)) {
    return make_error(
        "'{}' is a directory, not an IDX {} file; pass the file itself, or move the directory "
        "away so the file can take its place",
        path, kind);
  }
  if (!fs::is_regular_file(st)) return make_error("'{}' is not a regular file; pass an IDX {} file", path, kind);
  const std::uint64_t file_bytes = fs::file_size(path, ec);
  if (ec) {
    return make_error("cannot read the size of IDX file '{}': {}; check its permissions", path,
                      ec.message());
  }
  return file_bytes;
}

// The IDX header after the file's start: its magic (which must be `magic`)
// and the sizes it declares (dims), with their product in bytes.
Result<std::uint64_t> read_idx_header(gzFile f, const std::string& path, std::uint32_t magic, const char* kind,
                                      IdxFile& idx) {
  MT_ASSIGN(const std::uint32_t found_magic, read_u32(f, path));
  // gzread passes plain files through; a `.gz` name on plain bytes means the
  // download is damaged (or was never gzip) rather than a different format.
  if (gzdirect(f) == 1 && path.ends_with(".gz")) {
    return make_error("'{}' is named .gz but is not gzip data (no gzip header); {}", path, kFix);
  }
  if (found_magic != magic) {
    return make_error(
        "'{}' starts with magic {:#010x} ({}), but {} starts with {:#010x}; check the image and "
        "label paths are not swapped, or {}",
        path, found_magic, describe_magic(found_magic), describe_magic(magic), magic, kFix);
  }
  unsigned __int128 declared = 1;  // three 32-bit sizes can overflow 64 bits
  for (std::uint32_t d = 0; d < (magic & 0xff); ++d) {
    MT_ASSIGN(const std::uint32_t size, read_u32(f, path));
    idx.dims.push_back(size);
    declared *= size;
  }
  if (declared == 0) {
    return make_error("'{}' declares no data: {}; {}", path, describe_shape(idx.dims, 0), kFix);
  }
  const std::uint64_t header_bytes = 4 * (1 + idx.dims.size());
  if (declared > UINT64_MAX - header_bytes) {
    return make_error("'{}' declares {} bytes of {}s, more than any file holds; {}", path,
                      fmt::join(idx.dims, "×"), kind, kFix);
  }
  return static_cast<std::uint64_t>(declared);
}

// One IDX file of unsigned bytes whose magic must be `magic`; `kind` ("image"
// or "label") words the messages.
Result<IdxFile> read_idx(const std::string& path, std::uint32_t magic, const char* kind) {
  MT_ASSIGN(const std::uint64_t file_bytes, idx_file_bytes(path, kind));
  GzHandle f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) {
    return make_error("cannot read IDX file '{}': {}; check its permissions", path,
                      std::strerror(errno));
  }
  gzbuffer(f.get(), 1 << 17);
  IdxFile idx;
  MT_ASSIGN(const std::uint64_t want, read_idx_header(f.get(), path, magic, kind, idx));
  const bool plain = gzdirect(f.get()) == 1;
  const std::uint64_t header_bytes = 4 * (1 + idx.dims.size());
  auto size_error = [&](std::uint64_t found) {
    return make_error("'{}' {}: header says {}, found {}; {}", path,
                      found < want ? "is truncated" : "has trailing data",
                      describe_shape(idx.dims, want), found, kFix);
  };
  // A plain file's payload size is known before reading: refuse a wrong one
  // without allocating what the header claims.
  if (plain && file_bytes - header_bytes != want) return size_error(file_bytes - header_bytes);

  // What the header declares is held in memory: a header (or a gzip bomb) beyond the machine is refused first.
  MT_TRY(check_host_memory(static_cast<double>(want), fmt::format("reading IDX file '{}' ({})", path,
                                                                   describe_shape(idx.dims, want)),
                           "check the file: no Fashion-MNIST or MNIST file is larger than 50 MB"));
  idx.payload.reserve(plain ? want : std::min(want, kGzipReserveRatio * file_bytes));
  // Keep the declared bytes and count any beyond them, so a long file is
  // reported with its real size and never grows memory past the declaration.
  std::vector<std::uint8_t> chunk(1 << 16);
  std::uint64_t found = 0;
  for (;;) {
    MT_ASSIGN(const std::size_t got, read_some(f.get(), path, chunk.data(), chunk.size()));
    if (got == 0) break;
    const std::uint64_t keep = std::min<std::uint64_t>(got, want - std::min(want, found));
    idx.payload.insert(idx.payload.end(), chunk.begin(), chunk.begin() + keep);
    found += got;
  }
  if (found != want) return size_error(found);
  return idx;
}

Result<ImageSet> load_image_set(const std::string& images_path, const std::string& labels_path,
                                int classes) {
  MT_ASSIGN(IdxImages images, read_idx_images(images_path));
  MT_ASSIGN(IdxLabels labels, read_idx_labels(labels_path, classes));
  if (labels.count != images.count) {
    return make_error(
        "'{}' holds {} labels but '{}' holds {} images; the two files must come from the same "
        "copy: {}",
        labels_path, labels.count, images_path, images.count, kFix);
  }
  ImageSet s;
  s.count = images.count;
  s.rows = images.rows;
  s.cols = images.cols;
  s.channels = 1;
  s.pixels = std::move(images.pixels);
  s.labels = std::move(labels.labels);
  s.images_path = images_path;
  s.labels_path = labels_path;
  return s;
}

// The directory `name_or_dir` names, and the class count its name implies (0: none).
Result<std::pair<std::string, int>> resolve_dir(const std::string& name_or_dir) {
  if (name_or_dir == "fashion-mnist") {
    if (!fs::is_directory(kFashionMnistDir)) {
      return make_error("Fashion-MNIST is not installed ({} does not exist); {}", kFashionMnistDir,
                        kInstall);
    }
    return std::pair<std::string, int>{kFashionMnistDir, kFashionMnistClasses};
  }
  std::error_code ec;
  const auto st = fs::status(name_or_dir, ec);
  if (!fs::exists(st)) {
    return make_error(
        "image data '{}' is neither a dataset name (fashion-mnist) nor an existing directory; {}",
        name_or_dir, kInstall);
  }
  if (!fs::is_directory(st)) {
    return make_error(
        "image data '{}' is a file, but image data is a directory holding {}[.gz], {}[.gz], "
        "{}[.gz] and {}[.gz]; pass that directory or the name fashion-mnist",
        name_or_dir, kMnistFiles[0], kMnistFiles[1], kMnistFiles[2], kMnistFiles[3]);
  }
  return std::pair<std::string, int>{name_or_dir, 0};
}

}  // namespace

Result<IdxImages> read_idx_images(const std::string& path) {
  MT_ASSIGN(IdxFile idx, read_idx(path, kIdxImagesMagic, "image"));
  // Each size fits 32 bits; a model indexes an image with an int.
  if (std::uint64_t{idx.dims[1]} * idx.dims[2] > INT_MAX) {
    return make_error("'{}' declares {}×{} images, too large to index; {}", path, idx.dims[1],
                      idx.dims[2], kFix);
  }
  return IdxImages{path, idx.dims[0], static_cast<int>(idx.dims[1]), static_cast<int>(idx.dims[2]),
                   std::move(idx.payload)};
}

Result<IdxLabels> read_idx_labels(const std::string& path, int classes) {
  if (classes < 1 || classes > kMaxIdxClasses) {
    return make_error("the class count must be in 1..{} for byte labels, got {}", kMaxIdxClasses,
                      classes);
  }
  MT_ASSIGN(IdxFile idx, read_idx(path, kIdxLabelsMagic, "label"));
  const auto bad = std::find_if(idx.payload.begin(), idx.payload.end(),
                                [&](std::uint8_t l) { return l >= classes; });
  if (bad != idx.payload.end()) {
    return make_error(
        "'{}' has label {} at index {}, but there are {} classes (labels 0..{}); pass the class "
        "count the data uses, or {}",
        path, *bad, bad - idx.payload.begin(), classes, classes - 1, kFix);
  }
  return IdxLabels{path, idx.dims[0], std::move(idx.payload)};
}

PixelStats pixel_stats(const ImageSet& set) {
  const int c_count = set.channels;
  // Integer histograms make the sums exact (and the result independent of order).
  std::vector<std::array<std::uint64_t, 256>> hist(c_count);
  for (auto& h : hist) h.fill(0);
  for (std::size_t p = 0; p < set.pixels.size(); ++p) ++hist[p % c_count][set.pixels[p]];
  PixelStats s;
  for (const auto& h : hist) {
    unsigned __int128 n = 0, sum = 0, sum2 = 0;
    for (unsigned v = 0; v < 256; ++v) {
      n += h[v];
      sum += static_cast<unsigned __int128>(h[v]) * v;
      sum2 += static_cast<unsigned __int128>(h[v]) * v * v;
    }
    if (n == 0) {
      s.mean.push_back(0.0);
      s.std.push_back(1.0);
      continue;
    }
    // var·255²·n² = n·Σv² − (Σv)², exact in 128 bits.
    const unsigned __int128 var_num = n * sum2 - sum * sum;
    const double nd = static_cast<double>(n);
    s.mean.push_back(static_cast<double>(sum) / (255.0 * nd));
    s.std.push_back(var_num == 0 ? 1.0 : std::sqrt(static_cast<double>(var_num)) / (255.0 * nd));
  }
  return s;
}

bool names_image_dataset(const std::string& name_or_dir) {
  std::error_code ec;
  const auto st = fs::status(name_or_dir, ec);
  if (fs::is_regular_file(st)) return false;
  if (name_or_dir == "fashion-mnist") return true;
  if (!fs::is_directory(st)) return false;
  for (const char* file : kMnistFiles)
    if (fs::exists(fs::path(name_or_dir) / file, ec) || fs::exists(fs::path(name_or_dir) / (std::string(file) + ".gz"), ec))
      return true;
  return false;
}

Result<ImageDataset> load_image_dataset(const std::string& name_or_dir, int classes) {
  MT_ASSIGN(const auto resolved, resolve_dir(name_or_dir));
  const auto& [dir, implied_classes] = resolved;
  if (classes == 0) classes = implied_classes;
  if (classes < 0 || classes > kMaxIdxClasses) {
    return make_error("the class count must be in 1..{} for byte labels, got {}", kMaxIdxClasses,
                      classes);
  }

  // Each file plain or gzipped; the plain one wins (no inflating to do).
  std::array<std::string, 4> paths;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < kMnistFiles.size(); ++i) {
    const fs::path plain = fs::path(dir) / kMnistFiles[i];
    const fs::path gz = fs::path(dir) / (std::string(kMnistFiles[i]) + ".gz");
    if (fs::exists(plain)) {
      paths[i] = plain.string();
    } else if (fs::exists(gz)) {
      paths[i] = gz.string();
    } else {
      missing.push_back(std::string(kMnistFiles[i]) + "[.gz]");
    }
  }
  if (!missing.empty()) {
    return make_error("image data directory '{}' lacks {}; {}", dir, fmt::join(missing, ", "),
                      kInstall);
  }

  const int read_classes = classes == 0 ? kMaxIdxClasses : classes;
  ImageDataset d;
  d.dir = dir;
  MT_ASSIGN(d.train, load_image_set(paths[0], paths[1], read_classes));
  MT_ASSIGN(d.test, load_image_set(paths[2], paths[3], read_classes));
  if (d.test.rows != d.train.rows || d.test.cols != d.train.cols) {
    return make_error(
        "'{}' holds {}×{} images but '{}' holds {}×{}; the training and test sets must share one "
        "image size: {}",
        d.train.images_path, d.train.rows, d.train.cols, d.test.images_path, d.test.rows,
        d.test.cols, kFix);
  }
  if (classes == 0) {
    // Both splits share one label range, so a model head sized from it fits either.
    const auto max_label = [](const ImageSet& s) {
      return static_cast<int>(*std::max_element(s.labels.begin(), s.labels.end()));
    };
    classes = std::max(max_label(d.train), max_label(d.test)) + 1;
  }
  d.train.classes = d.test.classes = classes;
  d.stats = pixel_stats(d.train);
  return d;
}

Status check_image_shape(const ImageSet& set, int rows, int cols, int channels) {
  if (set.rows == rows && set.cols == cols && set.channels == channels) return ok_status();
  return make_error(
      "images in '{}' are {}×{}×{} (rows×cols×channels), but the model takes {}×{}×{}; configure "
      "the model for {}×{} images with {} channel(s), or load a dataset of {}×{}×{} images",
      set.images_path, set.rows, set.cols, set.channels, rows, cols, channels, set.rows, set.cols,
      set.channels, rows, cols, channels);
}

}  // namespace meshtrain
