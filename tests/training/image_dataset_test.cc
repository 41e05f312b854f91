#include "engine/data/image_dataset.h"

#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "error_of.h"
#include "idx_files.h"
#include "temp_dir.h"
#include "tests/skip.h"

using namespace meshtrain;
using meshtrain::testing::error_of;
using meshtrain::testing::idx_bytes;
using meshtrain::testing::read_file;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_file;

namespace {

// Same signature as write_file, so a test can pick either.
void write_gz(const std::string& path, std::string_view bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// n images of rows×cols whose pixel p of image i is (i·31 + p·7) mod 256.
std::string image_payload(int n, int rows, int cols) {
  std::string p;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < rows * cols; ++k) p.push_back(static_cast<char>((i * 31 + k * 7) % 256));
  return p;
}

std::string images_file(int n, int rows, int cols) {
  return idx_bytes(kIdxImagesMagic, {std::uint32_t(n), std::uint32_t(rows), std::uint32_t(cols)},
                   image_payload(n, rows, cols));
}

std::string labels_file(const std::string& labels) {
  return idx_bytes(kIdxLabelsMagic, {std::uint32_t(labels.size())}, labels);
}

// A complete MNIST-layout directory: 5 training and 2 test images of 3×4,
// training files gzipped, test files plain.
void write_mnist_dir(const TempDir& tmp) {
  write_gz(tmp / "train-images-idx3-ubyte.gz", images_file(5, 3, 4));
  write_gz(tmp / "train-labels-idx1-ubyte.gz", labels_file({0, 2, 1, 2, 0}));
  write_file(tmp / "t10k-images-idx3-ubyte", images_file(2, 3, 4));
  write_file(tmp / "t10k-labels-idx1-ubyte", labels_file({3, 1}));
}

std::string images_error(const std::string& path) { return error_of(read_idx_images(path)); }

std::string dataset_error(const std::string& name_or_dir, int classes = 0) {
  return error_of(load_image_dataset(name_or_dir, classes));
}

}  // namespace

TEST_CASE("IDX files round-trip, plain and gzipped", "[image-dataset]") {
  TempDir tmp;
  for (const bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    const std::string images = tmp / (gz ? "i.gz" : "i");
    const std::string labels = tmp / (gz ? "l.gz" : "l");
    (gz ? write_gz : write_file)(images, images_file(5, 3, 4));
    (gz ? write_gz : write_file)(labels, labels_file({9, 0, 4, 4, 1}));

    auto im = read_idx_images(images);
    REQUIRE(im.ok());
    CHECK(im->count == 5);
    CHECK(im->rows == 3);
    CHECK(im->cols == 4);
    const std::string expected = image_payload(5, 3, 4);
    CHECK(im->pixels == std::vector<std::uint8_t>(expected.begin(), expected.end()));

    auto lb = read_idx_labels(labels, 10);
    REQUIRE(lb.ok());
    CHECK(lb->count == 5);
    CHECK(lb->labels == std::vector<std::uint8_t>{9, 0, 4, 4, 1});
  }
}

TEST_CASE("a directory in the MNIST layout loads as train and test sets", "[image-dataset]") {
  TempDir tmp;
  write_mnist_dir(tmp);
  auto d = load_image_dataset(tmp.path().string());
  REQUIRE(d.ok());
  CHECK(d->dir == tmp.path().string());
  CHECK(d->train.count == 5);
  CHECK(d->test.count == 2);
  CHECK(d->train.rows == 3);
  CHECK(d->train.cols == 4);
  CHECK(d->train.channels == 1);
  CHECK(d->train.image_size() == 12);
  // max label + 1 over both splits: the test set's 3 sets the range for both.
  CHECK(d->train.classes == 4);
  CHECK(d->test.classes == 4);
  CHECK(d->train.images_path == tmp / "train-images-idx3-ubyte.gz");
  CHECK(d->test.labels_path == tmp / "t10k-labels-idx1-ubyte");
  CHECK(d->train.labels == std::vector<std::uint8_t>{0, 2, 1, 2, 0});
  CHECK(d->train.image(1)[0] == 31);  // image 1, pixel 0: 1·31
  CHECK(d->train.image(4)[11] == (4 * 31 + 11 * 7) % 256);
  CHECK(d->stats.mean.size() == 1);

  // A class count the caller knows is kept, and checked.
  auto ten = load_image_dataset(tmp.path().string(), 10);
  REQUIRE(ten.ok());
  CHECK(ten->test.classes == 10);
  CHECK_THAT(dataset_error(tmp.path().string(), 3),
             Catch::Contains("has label 3 at index 0, but there are 3 classes (labels 0..2)"));

  // The plain file wins over a gzipped one of the same name.
  write_file(tmp / "train-images-idx3-ubyte", images_file(5, 3, 4));
  auto both = load_image_dataset(tmp.path().string());
  REQUIRE(both.ok());
  CHECK(both->train.images_path == tmp / "train-images-idx3-ubyte");
}

TEST_CASE("the wrong magic names both kinds and the likely mix-up", "[image-dataset]") {
  TempDir tmp;
  const std::string labels = tmp / "labels";
  write_file(labels, labels_file({1, 2}));
  CHECK_THAT(images_error(labels),
             Catch::Contains("starts with magic 0x00000801 (an IDX label file), but an IDX image "
                             "file starts with 0x00000803") &&
                 Catch::Contains("not swapped"));
  const std::string floats = tmp / "floats";
  write_file(floats, idx_bytes(0x00000d03, {1, 1, 1}, "abcd"));
  CHECK_THAT(images_error(floats), Catch::Contains("(an IDX file of type 0x0d with 3 dimensions)"));
  const std::string text = tmp / "text";
  write_file(text, "hello, world, not IDX");
  CHECK_THAT(images_error(text), Catch::Contains("(not an IDX file)"));
}

TEST_CASE("a payload shorter or longer than the header is refused", "[image-dataset]") {
  TempDir tmp;
  const std::string header = idx_bytes(kIdxImagesMagic, {5, 3, 4}, "");
  const std::string payload = image_payload(5, 3, 4);  // 60 bytes
  for (const bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    const std::string path = tmp / (gz ? "images.gz" : "images");
    (gz ? write_gz : write_file)(path, header + payload.substr(0, 59));
    CHECK_THAT(images_error(path),
               Catch::Contains("'" + path +
                               "' is truncated: header says 5 images of 3×4 = 60 "
                               "bytes, found 59") &&
                   Catch::Contains("apt-get install --reinstall dataset-fashion-mnist"));
    (gz ? write_gz : write_file)(path, header + payload + "xyz");
    CHECK_THAT(images_error(path),
               Catch::Contains("has trailing data: header says 5 images of 3×4 = 60 bytes, "
                               "found 63"));
    (gz ? write_gz : write_file)(path, header.substr(0, 10));
    CHECK_THAT(images_error(path), Catch::Contains("ends inside the IDX header"));
    (gz ? write_gz : write_file)(path, idx_bytes(kIdxImagesMagic, {0, 28, 28}, ""));
    CHECK_THAT(images_error(path), Catch::Contains("declares no data: 0 images of 28×28"));
  }
  const std::string labels = tmp / "labels";
  write_file(labels, idx_bytes(kIdxLabelsMagic, {7}, "abc"));
  CHECK_THAT(error_of(read_idx_labels(labels)),
             Catch::Contains("is truncated: header says 7 labels = 7 bytes, found 3"));
}

TEST_CASE("a header claiming 2^32 images fails on the file's real size", "[image-dataset]") {
  // 4294967295·28·28 bytes would be 3.4 TB; the file holds 10. Nothing may
  // allocate the claim: a plain file is refused on its real size, a gzipped
  // one (whose size is known only by inflating it: a gzip bomb of zeros would
  // fill memory) on the claim against this machine's memory.
  TempDir tmp;
  const std::string bytes = idx_bytes(kIdxImagesMagic, {0xffffffffu, 28, 28}, "0123456789");
  write_file(tmp / "huge", bytes);
  CHECK_THAT(images_error(tmp / "huge"), Catch::Contains("is truncated: header says 4294967295 images of 28×28 = "
                                                         "3367254359280 bytes, found 10"));
  write_gz(tmp / "huge.gz", bytes);
  CHECK_THAT(images_error(tmp / "huge.gz"),
             Catch::Contains("reading IDX file '" + (tmp / "huge.gz") + "' (4294967295 images of 28×28 = "
                             "3367254359280 bytes) needs about 3.06 TiB"));
  const std::string overflow = tmp / "overflow";
  write_file(overflow, idx_bytes(kIdxImagesMagic, {0xffffffffu, 0xffffffffu, 0xffffffffu}, ""));
  CHECK_THAT(images_error(overflow), Catch::Contains("more than any file holds"));
}

TEST_CASE("corrupt gzip is an error naming the file, not a crash", "[image-dataset]") {
  TempDir tmp;
  const std::string good = tmp / "good.gz";
  write_gz(good, images_file(50, 8, 8));
  const std::string bytes = read_file(good);

  // A byte flipped in the deflate stream: a bad code or, at worst, a bad CRC.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x5a);
  const std::string bad = tmp / "flipped.gz";
  write_file(bad, flipped);
  CHECK_THAT(images_error(bad),
             Catch::Contains("'" + bad + "' is corrupt or cut-off gzip data (") &&
                 !Catch::Contains("(" + bad));

  // Intact deflate data under a wrong CRC-32 (the trailer's first byte): only
  // reading to the end of the stream notices.
  std::string bad_crc = bytes;
  bad_crc[bad_crc.size() - 8] = static_cast<char>(bad_crc[bad_crc.size() - 8] ^ 1);
  write_file(bad, bad_crc);
  CHECK_THAT(images_error(bad),
             Catch::Contains("is corrupt or cut-off gzip data (incorrect data check)"));

  // The compressed stream cut off halfway.
  const std::string cut = tmp / "cut.gz";
  write_file(cut, bytes.substr(0, bytes.size() / 2));
  CHECK_THAT(images_error(cut), Catch::Contains("is corrupt or cut-off gzip data"));

  // A .gz name on bytes that are not gzip.
  const std::string fake = tmp / "fake.gz";
  write_file(fake, images_file(1, 2, 2));
  CHECK_THAT(images_error(fake), Catch::Contains("is named .gz but is not gzip data"));
}

TEST_CASE("label counts must equal image counts and labels be below the class count",
          "[image-dataset]") {
  TempDir tmp;
  write_mnist_dir(tmp);
  write_gz(tmp / "train-labels-idx1-ubyte.gz", labels_file({0, 1, 2, 3}));
  CHECK_THAT(dataset_error(tmp.path().string()),
             Catch::Contains("holds 4 labels but '" + tmp / "train-images-idx3-ubyte.gz" +
                             "' holds 5 images"));

  const std::string labels = tmp / "labels";
  write_file(labels, labels_file({0, 1, 7}));
  CHECK_THAT(error_of(read_idx_labels(labels, 5)),
             Catch::Contains("has label 7 at index 2, but there are 5 classes"));
  CHECK(read_idx_labels(labels, 8).ok());
  CHECK_THAT(error_of(read_idx_labels(labels, 0)),
             Catch::Contains("class count must be in 1..256"));
}

TEST_CASE("missing files, files for directories and unknown names are named with the fix",
          "[image-dataset]") {
  TempDir tmp;
  const std::string missing = tmp / "nope-idx3-ubyte";
  CHECK_THAT(images_error(missing),
             Catch::Contains("IDX image file '" + missing + "' does not exist") &&
                 Catch::Contains("apt-get install dataset-fashion-mnist"));

  write_mnist_dir(tmp);
  std::filesystem::remove(tmp / "t10k-labels-idx1-ubyte");
  std::filesystem::remove(tmp / "train-images-idx3-ubyte.gz");
  CHECK_THAT(dataset_error(tmp.path().string()),
             Catch::Contains("lacks train-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]") &&
                 Catch::Contains("apt-get install dataset-fashion-mnist"));

  // A directory where a file belongs, and a file where a directory belongs.
  std::filesystem::create_directory(tmp / "t10k-labels-idx1-ubyte");
  write_gz(tmp / "train-images-idx3-ubyte.gz", images_file(5, 3, 4));
  CHECK_THAT(dataset_error(tmp.path().string()),
             Catch::Contains("'" + tmp / "t10k-labels-idx1-ubyte" +
                             "' is a directory, not an IDX label file"));
  CHECK_THAT(dataset_error(tmp / "train-images-idx3-ubyte.gz"),
             Catch::Contains("is a file, but image data is a directory holding "
                             "train-images-idx3-ubyte[.gz]"));
  CHECK_THAT(
      dataset_error(tmp / "no-such-dir"),
      Catch::Contains("is neither a dataset name (fashion-mnist) nor an existing directory"));
}

TEST_CASE("training and test sets must share one image size", "[image-dataset]") {
  TempDir tmp;
  write_mnist_dir(tmp);
  write_file(tmp / "t10k-images-idx3-ubyte", images_file(2, 4, 3));
  CHECK_THAT(dataset_error(tmp.path().string()),
             Catch::Contains("holds 3×4 images but") && Catch::Contains("holds 4×3"));
}

TEST_CASE("the image shape check names both sizes and the fix", "[image-dataset]") {
  ImageSet set;
  set.rows = set.cols = 28;
  set.images_path = "/data/train-images-idx3-ubyte.gz";
  CHECK(check_image_shape(set, 28, 28, 1).ok());
  CHECK_THAT(error_of(check_image_shape(set, 32, 32, 3)),
             Catch::Contains("are 28×28×1 (rows×cols×channels), but the model takes 32×32×3") &&
                 Catch::Contains("configure the model for 28×28 images with 1 channel(s)"));
}

TEST_CASE("pixel statistics are computed from the data, per channel", "[image-dataset]") {
  ImageSet set;
  set.channels = 2;
  // Channel 0 alternates 0 and 255 (mean 0.5, std 0.5); channel 1 is all 51 (0.2, constant).
  set.pixels = {0, 51, 255, 51, 0, 51, 255, 51};
  const PixelStats s = pixel_stats(set);
  REQUIRE(s.mean.size() == 2);
  CHECK(s.mean[0] == Approx(0.5));
  CHECK(s.std[0] == Approx(0.5));
  CHECK(s.mean[1] == Approx(0.2));
  CHECK(s.std[1] == 1.0);  // constant: only centred
}

TEST_CASE("Fashion-MNIST from dataset-fashion-mnist", "[image-dataset]") {
  if (!std::filesystem::is_directory(kFashionMnistDir)) {
    // The missing package is named before the test skips itself.
    REQUIRE_THAT(dataset_error("fashion-mnist"), Catch::Contains("Fashion-MNIST is not installed"));
    MT_SKIP_MISSING(kFashionMnistDir, "dataset-fashion-mnist");
  }
  auto d = load_image_dataset("fashion-mnist");
  REQUIRE(d.ok());
  CHECK(d->train.count == 60000);
  CHECK(d->test.count == 10000);
  CHECK(d->train.rows == 28);
  CHECK(d->train.cols == 28);
  CHECK(d->train.channels == 1);
  CHECK(d->train.classes == 10);
  CHECK(d->test.classes == 10);
  CHECK(d->train.pixels.size() == 60000u * 28 * 28);
  // Fashion-MNIST's published training statistics: mean 0.2860, std 0.3530.
  REQUIRE(d->stats.mean.size() == 1);
  CHECK(d->stats.mean[0] == Approx(0.2860).margin(5e-4));
  CHECK(d->stats.std[0] == Approx(0.3530).margin(5e-4));
  // Every class appears, 6000 times each in training.
  std::vector<int> per_class(10, 0);
  for (std::uint8_t l : d->train.labels) ++per_class[l];
  CHECK(per_class == std::vector<int>(10, 6000));
  CHECK(check_image_shape(d->train, 28, 28, 1).ok());
  CHECK_FALSE(check_image_shape(d->test, 32, 32, 1).ok());
}
