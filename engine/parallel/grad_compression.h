// CompressedReduction: the data-parallel reduction of a gradient bucket with
// the bucket compressed on the wire (Plan::grad_compression), built from
// backend ops only, so the cpu and cuda backends run it and the sim times the
// same casts, sign kernels and collectives.
//
// bf16, fp16 (PyTorch DDP's bf16/fp16 compress hooks): the bucket is cast to
// 16 bits and all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1/2/3) as such,
// by the backend's own algorithm (NCCL's ring or tree; the cpu communicators'
// direct exchange, summing in fp32 in ascending rank order and rounding once),
// then widened; half the bytes of fp32. fp16 first divides by the group size,
// as the hook does, so that the sum cannot overflow fp16's range, and
// multiplies the result back.
//
// 1bit (Tang et al. 2021's 1-bit Adam compressed all-reduce, with error
// feedback as in Seide et al. 2014 and Karimireddy et al. 2019's EF-SGD): a
// bucket of n over G ranks is cut into G blocks of k (n <= k·G, zero padded);
// member r owns block r.
//   1. every member adds its worker error to the G blocks and sends each as
//      signs with one scale per kSignChunk elements (Backend::sign_compress;
//      a block padded to whole chunks) to its owner
//      (all_to_all); member r decompresses the G copies of its block and sums
//      them in fp32 in ascending group order. ZeRO 1 stops here: the sum is
//      the rank's shard.
//   2. (ZeRO 0) member r compresses its sum with its server error, all_gather,
//      every member decompresses the G blocks into the bucket.
// About 1/28 of the bytes of fp32 (a bit per element and a 4-byte scale per
// 256). The worker error (G·k per bucket) and server error (k) carry what
// compression dropped into the next step; without error feedback they are
// dropped, which only shows why they are kept. Checkpoints hold them per rank
// (export_errors / import_errors), so a resumed run repeats the bits of an
// uninterrupted one. Padding takes part in its chunk's scale; its results are
// dropped.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backends/backend.h"

namespace meshtrain {

enum class GradCompression;

class CompressedReduction {
 public:
  // 1bit: elements per scale. A scale per block of a bucket would give a
  // layer norm's gradients the magnitude of an embedding's; 256 costs 4 bytes
  // per 32 of signs (1.125 bits per element, 1/28.4 of fp32).
  static constexpr std::int64_t kSignChunk = 256;

  // `kind` is not none; `buckets` is how many buckets will use this object
  // (each keeps its own error state).
  CompressedReduction(Backend& b, GradCompression kind, bool error_feedback, std::size_t buckets);

  // Allocates a bucket's error feedback (1bit; zeroed), held from now on like
  // optimizer state: the worker error (G, k), and for an all-reduce the
  // server error (1, k). Buckets reduced over one rank need none.
  void reserve(std::size_t bucket, std::int64_t k, int group_size, bool all_reduce);

  // The error feedback of every bucket (worker, then server error), bucket
  // by bucket, as one host vector; empty without 1bit error feedback.
  Result<std::vector<float>> export_errors();
  // Loads what export_errors wrote on this rank under the same plan.
  Status import_errors(std::span<const float> errors);
  std::int64_t error_numel() const;  // what export_errors returns

  // grads (n) f32, n <= k·g.size(): summed over g in place on every member.
  void all_reduce(std::size_t bucket, Tensor& grads, std::int64_t k, const Group& g);
  // grads (n) f32, n <= k·g.size(): out (k) f32 = this member's block of the
  // sum; elements past the bucket's end are 0.
  void reduce_scatter(std::size_t bucket, const Tensor& grads, Tensor& out, std::int64_t k, const Group& g);

 private:
  // grads (n) as `size` elements, zero padded (fp16: divided by the group size against overflow).
  Tensor padded(const Tensor& grads, std::int64_t size, const Group& g);
  // grads (n) as G blocks of k, each at a multiple of `stride` (>= k), zero padded.
  Tensor blocks_of(const Tensor& grads, std::int64_t k, std::int64_t stride, const Group& g);
  // 1bit phase 1 into sum (k) f32; elements past the bucket's end are 0.
  void one_bit_scatter(std::size_t bucket, const Tensor& grads, Tensor& sum, std::int64_t k, const Group& g);
  // Zeroes the elements of this member's block (sum (k)) past the bucket's n elements.
  void zero_padding(Tensor& sum, std::int64_t n, std::int64_t k, const Group& g);
  DType wire_dtype() const;

  Backend& b_;
  GradCompression kind_;
  bool error_feedback_;
  // 1bit error feedback by bucket (reserve()).
  std::vector<Tensor> worker_error_;  // (G, k)
  std::vector<Tensor> server_error_;  // (1, k)
};

}  // namespace meshtrain
