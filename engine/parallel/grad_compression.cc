#include "engine/parallel/grad_compression.h"

#include <algorithm>

#include "engine/plan.h"

namespace meshtrain {

namespace {
std::int64_t sign_words(std::int64_t k) { return (k + 31) / 32; }
}  // namespace

CompressedReduction::CompressedReduction(Backend& b, GradCompression kind, bool error_feedback,
                                         std::size_t buckets)
    : b_(b), kind_(kind), error_feedback_(error_feedback), worker_error_(buckets), server_error_(buckets) {}

DType CompressedReduction::wire_dtype() const { return kind_ == GradCompression::fp16 ? DType::f16 : DType::bf16; }

void CompressedReduction::zero_padding(Tensor& sum, std::int64_t n, std::int64_t k, const Group& g) {
  const std::int64_t r = g.index_of(b_.rank());
  const std::int64_t owned = std::clamp<std::int64_t>(n - r * k, 0, k);
  if (owned == k) return;
  Tensor tail = sum.slice(owned, k - owned);
  b_.fill(tail, 0.f);
}

void CompressedReduction::scatter_sum(std::size_t bucket, const Tensor& grads, Tensor& sum, std::int64_t k,
                                      const Group& g) {
  const std::int64_t G = g.size(), n = grads.numel();
  // The bucket padded to G blocks of k (fp16: divided by G against overflow).
  Tensor padded = grads;
  if (n != G * k || kind_ == GradCompression::fp16) {
    padded = b_.empty(Shape{G * k});
    Tensor head = padded.slice(0, n);
    b_.copy(grads, head);
    if (n != G * k) {
      Tensor tail = padded.slice(n, G * k - n);
      b_.fill(tail, 0.f);
    }
    if (kind_ == GradCompression::fp16) b_.scale(padded, 1.f / static_cast<float>(G));
  }
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(G),
                                         kind_ == GradCompression::one_bit ? 1 + sign_words(k) : k);
  Tensor blocks = b_.empty(Shape{G, k});  // the G received copies of this member's block, decompressed
  if (kind_ == GradCompression::one_bit) {
    Tensor& error = worker_error_[bucket];
    if (error_feedback_ && !error.defined()) error = b_.zeros(Shape{G, k});
    Tensor no_error;
    Tensor packets = b_.empty(Shape{G, 1 + sign_words(k)}, DType::i32);
    b_.sign_compress(padded.view(Shape{G, k}), error_feedback_ ? error : no_error, packets);
    Tensor received = b_.empty(Shape{G, 1 + sign_words(k)}, DType::i32);
    b_.all_to_all(packets, counts, received, counts, g);
    b_.sign_decompress(received, blocks);
  } else {
    Tensor wire = b_.empty(Shape{G * k}, wire_dtype());
    b_.cast(padded, wire);
    Tensor received = b_.empty(Shape{G * k}, wire_dtype());
    b_.all_to_all(wire, counts, received, counts, g);
    b_.cast(received, blocks);
  }
  b_.copy(blocks.slice(0, k), sum);
  for (std::int64_t q = 1; q < G; ++q) b_.add(sum, blocks.slice(q * k, k), sum);
}

void CompressedReduction::reduce_scatter(std::size_t bucket, const Tensor& grads, Tensor& out, std::int64_t k,
                                         const Group& g) {
  scatter_sum(bucket, grads, out, k, g);
  if (kind_ == GradCompression::fp16) b_.scale(out, static_cast<float>(g.size()));
  zero_padding(out, grads.numel(), k, g);
}

void CompressedReduction::all_reduce(std::size_t bucket, Tensor& grads, std::int64_t k, const Group& g) {
  const std::int64_t G = g.size(), n = grads.numel();
  Tensor sum = b_.empty(Shape{k});
  scatter_sum(bucket, grads, sum, k, g);
  if (kind_ == GradCompression::one_bit) {
    zero_padding(sum, n, k, g);
    Tensor& error = server_error_[bucket];
    if (error_feedback_ && !error.defined()) error = b_.zeros(Shape{1, k});
    Tensor no_error;
    Tensor mine = b_.empty(Shape{1, 1 + sign_words(k)}, DType::i32);
    b_.sign_compress(sum.view(Shape{1, k}), error_feedback_ ? error : no_error, mine);
    Tensor all = b_.empty(Shape{G, 1 + sign_words(k)}, DType::i32);
    b_.all_gather(mine, all, g);
    if (n == G * k) {
      Tensor whole = grads.view(Shape{G, k});
      b_.sign_decompress(all, whole);
      return;
    }
    Tensor blocks = b_.empty(Shape{G, k});
    b_.sign_decompress(all, blocks);
    b_.copy(blocks.slice(0, n), grads);
    return;
  }
  // The sum, rounded to 16 bits once more (fp16: still divided by G), gathered and widened.
  Tensor mine = b_.empty(Shape{k}, wire_dtype());
  b_.cast(sum, mine);
  Tensor all = b_.empty(Shape{G * k}, wire_dtype());
  b_.all_gather(mine, all, g);
  b_.cast(all.slice(0, n), grads);
  if (kind_ == GradCompression::fp16) b_.scale(grads, static_cast<float>(G));
}

}  // namespace meshtrain
