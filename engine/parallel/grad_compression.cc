#include "engine/parallel/grad_compression.h"

#include <algorithm>

#include "engine/plan/plan.h"

namespace meshtrain {

namespace {
// Words of one chunk's packet: its scale, then its signs.
constexpr std::int64_t kPacketWords = 1 + CompressedReduction::kSignChunk / 32;
// A block of k in whole chunks.
std::int64_t chunk_stride(std::int64_t k) {
  return (k + CompressedReduction::kSignChunk - 1) / CompressedReduction::kSignChunk * CompressedReduction::kSignChunk;
}
}  // namespace

CompressedReduction::CompressedReduction(Backend& b, GradCompression kind, bool error_feedback,
                                         std::size_t buckets)
    : b_(b), kind_(kind), error_feedback_(error_feedback), worker_error_(buckets), server_error_(buckets) {}

void CompressedReduction::reserve(std::size_t bucket, std::int64_t k, int group_size, bool all_reduce) {
  if (kind_ != GradCompression::one_bit || !error_feedback_ || group_size == 1) return;
  const std::int64_t rows = chunk_stride(k) / kSignChunk;
  worker_error_[bucket] = b_.zeros(Shape{group_size * rows, kSignChunk});
  if (all_reduce) server_error_[bucket] = b_.zeros(Shape{rows, kSignChunk});
}

Result<std::vector<float>> CompressedReduction::export_errors() {
  std::vector<float> out;
  for (std::size_t i = 0; i < worker_error_.size(); ++i)
    for (const Tensor* t : {&worker_error_[i], &server_error_[i]}) {
      if (!t->defined()) continue;
      const std::size_t at = out.size();
      out.resize(at + static_cast<std::size_t>(t->numel()));
      MT_TRY(b_.read(*t, std::span<float>(out).subspan(at)));
    }
  return out;
}

std::int64_t CompressedReduction::error_numel() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < worker_error_.size(); ++i)
    for (const Tensor* t : {&worker_error_[i], &server_error_[i]})
      if (t->defined()) n += t->numel();
  return n;
}

Status CompressedReduction::import_errors(std::span<const float> errors) {
  if (static_cast<std::int64_t>(errors.size()) != error_numel())
    return make_error("the checkpoint holds {} error-feedback values for this rank, its buckets need {}",
                      errors.size(), error_numel());
  std::size_t at = 0;
  for (std::size_t i = 0; i < worker_error_.size(); ++i)
    for (Tensor* t : {&worker_error_[i], &server_error_[i]}) {
      if (!t->defined()) continue;
      const auto n = static_cast<std::size_t>(t->numel());
      b_.write(*t, errors.subspan(at, n));
      at += n;
    }
  return ok_status();
}

DType CompressedReduction::wire_dtype() const { return kind_ == GradCompression::fp16 ? DType::f16 : DType::bf16; }

void CompressedReduction::zero_padding(Tensor& sum, std::int64_t n, std::int64_t k, const Group& g) {
  const std::int64_t r = g.index_of(b_.rank());
  const std::int64_t owned = std::clamp<std::int64_t>(n - r * k, 0, k);
  if (owned == k) return;
  Tensor tail = sum.slice(owned, k - owned);
  b_.fill(tail, 0.f);
}

Tensor CompressedReduction::padded(const Tensor& grads, std::int64_t size, const Group& g) {
  const std::int64_t n = grads.numel();
  if (n == size && kind_ != GradCompression::fp16) return grads;
  Tensor out = b_.empty(Shape{size});
  Tensor head = out.slice(0, n);
  b_.copy(grads, head);
  if (n != size) {
    Tensor tail = out.slice(n, size - n);
    b_.fill(tail, 0.f);
  }
  if (kind_ == GradCompression::fp16) b_.scale(out, 1.f / static_cast<float>(g.size()));
  return out;
}

Tensor CompressedReduction::blocks_of(const Tensor& grads, std::int64_t k, std::int64_t stride, const Group& g) {
  const std::int64_t G = g.size(), n = grads.numel();
  if (stride == k) return padded(grads, G * k, g);
  Tensor out = b_.zeros(Shape{G * stride});
  for (std::int64_t j = 0; j < G && j * k < n; ++j) {
    Tensor dst = out.slice(j * stride, std::min(k, n - j * k));
    b_.copy(grads.slice(j * k, dst.numel()), dst);
  }
  return out;
}

void CompressedReduction::one_bit_scatter(std::size_t bucket, const Tensor& grads, Tensor& sum, std::int64_t k,
                                          const Group& g) {
  const std::int64_t G = g.size(), stride = chunk_stride(k), rows = stride / kSignChunk;
  const Tensor x = blocks_of(grads, k, stride, g);
  Tensor& error = worker_error_[bucket];
  Tensor no_error;
  Tensor packets = b_.empty(Shape{G * rows, kPacketWords}, DType::i32);
  b_.sign_compress(x.view(Shape{G * rows, kSignChunk}), error_feedback_ ? error : no_error, packets);
  // Block j's rows go to member j; member r receives every member's rows of block r.
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(G), rows * kPacketWords);
  Tensor received = b_.empty(Shape{G * rows, kPacketWords}, DType::i32);
  b_.all_to_all(packets, counts, received, counts, g);
  Tensor blocks = b_.empty(Shape{G * rows, kSignChunk});
  b_.sign_decompress(received, blocks);
  b_.copy(blocks.slice(0, k), sum);
  for (std::int64_t q = 1; q < G; ++q) b_.add(sum, blocks.slice(q * stride, k), sum);
  zero_padding(sum, grads.numel(), k, g);
}

void CompressedReduction::reduce_scatter(std::size_t bucket, const Tensor& grads, Tensor& out, std::int64_t k,
                                         const Group& g) {
  if (kind_ == GradCompression::one_bit) {
    one_bit_scatter(bucket, grads, out, k, g);
    return;
  }
  const std::int64_t G = g.size();
  Tensor wire = b_.empty(Shape{G * k}, wire_dtype());
  b_.cast(padded(grads, G * k, g), wire);
  Tensor mine = b_.empty(Shape{k}, wire_dtype());
  b_.reduce_scatter(wire, mine, g, ReduceOp::sum);
  b_.cast(mine, out);
  if (kind_ == GradCompression::fp16) b_.scale(out, static_cast<float>(G));
}

void CompressedReduction::all_reduce(std::size_t bucket, Tensor& grads, std::int64_t k, const Group& g) {
  const std::int64_t G = g.size(), n = grads.numel();
  if (kind_ != GradCompression::one_bit) {
    Tensor wire = b_.empty(Shape{n}, wire_dtype());
    b_.cast(padded(grads, n, g), wire);
    b_.all_reduce(wire, g, ReduceOp::sum);
    b_.cast(wire, grads);
    if (kind_ == GradCompression::fp16) b_.scale(grads, static_cast<float>(G));
    return;
  }
  Tensor sum = b_.empty(Shape{k});
  one_bit_scatter(bucket, grads, sum, k, g);
  // Phase 2: this member's sum, compressed again with its own error feedback, to every member.
  const std::int64_t stride = chunk_stride(k), rows = stride / kSignChunk;
  Tensor wide = sum;
  if (stride != k) {
    wide = b_.zeros(Shape{stride});
    Tensor head = wide.slice(0, k);
    b_.copy(sum, head);
  }
  Tensor& error = server_error_[bucket];
  Tensor no_error;
  Tensor mine = b_.empty(Shape{rows, kPacketWords}, DType::i32);
  b_.sign_compress(wide.view(Shape{rows, kSignChunk}), error_feedback_ ? error : no_error, mine);
  Tensor all = b_.empty(Shape{G * rows, kPacketWords}, DType::i32);
  b_.all_gather(mine, all, g);
  if (stride == k && n == G * k) {
    Tensor whole = grads.view(Shape{G * rows, kSignChunk});
    b_.sign_decompress(all, whole);
    return;
  }
  Tensor blocks = b_.empty(Shape{G * rows, kSignChunk});
  b_.sign_decompress(all, blocks);
  for (std::int64_t j = 0; j < G && j * k < n; ++j) {
    Tensor dst = grads.slice(j * k, std::min(k, n - j * k));
    b_.copy(blocks.slice(j * stride, dst.numel()), dst);
  }
}

}  // namespace meshtrain
