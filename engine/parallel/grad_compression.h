// CompressedReduction: the data-parallel reduction of a gradient bucket with
// the bucket compressed on the wire (Plan::grad_compression), built from
// backend ops only, so the cpu and cuda backends run it and the sim times the
// same casts, sign kernels and collectives.
//
// A bucket of n gradients over a group of G ranks is cut into G blocks of k
// (n <= k·G; the padding is zero); member r owns block r. The reduction runs
// in two phases, the direct reduce-scatter + all-gather of the uncompressed
// path with compressed payloads:
//   1. scatter: every member compresses all G blocks and sends block j to
//      member j (all_to_all); member r decompresses the G copies of its block
//      and sums them in fp32 in ascending group order.
//   2. gather (all-reduce only, ZeRO 0): member r compresses its summed block,
//      all_gather, every member decompresses the G blocks into the bucket.
// ZeRO 1 (and the reduce-scatter of ZeRO 2/3 under bf16/fp16) stops after
// phase 1: the summed block is the rank's shard, never recompressed.
//
// Payloads:
//   bf16, fp16  the blocks cast to 16 bits (PyTorch DDP's bf16/fp16 compress
//               hooks); fp16 first divides by G, as the hook does, so that the
//               sum of G values cannot overflow fp16's range, and multiplies
//               the result back. The sum itself is fp32, rounded to 16 bits
//               once more for phase 2. Half the bytes of fp32.
//   1bit        signs with one scale per block (Backend::sign_compress): the
//               worker error of phase 1 (G·k per bucket) and the server error
//               of phase 2 (k per bucket) are kept across steps and added to
//               the next step's values (error feedback: Seide et al. 2014,
//               Karimireddy et al. 2019's EF-SGD, Tang et al. 2021's 1-bit
//               Adam, whose two-phase compressed all-reduce this is). About
//               1/32 of the bytes of fp32. Without error feedback the errors
//               are dropped, which only shows why they are kept. The error
//               buffers are not checkpointed: a resumed run starts them at
//               zero.
// The padding of a ragged bucket (fewer than G elements) takes part in its
// last block's scale under 1bit; its results are dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"

namespace meshtrain {

enum class GradCompression;

class CompressedReduction {
 public:
  // `kind` is not none; `buckets` is how many buckets will use this object
  // (each keeps its own error state).
  CompressedReduction(Backend& b, GradCompression kind, bool error_feedback, std::size_t buckets);

  // grads (n) f32, n <= k·g.size(): summed over g in place on every member.
  void all_reduce(std::size_t bucket, Tensor& grads, std::int64_t k, const Group& g);
  // grads (n) f32, n <= k·g.size(): out (k) f32 = this member's block of the
  // sum; elements past the bucket's end are 0.
  void reduce_scatter(std::size_t bucket, const Tensor& grads, Tensor& out, std::int64_t k, const Group& g);

 private:
  // Phase 1 into sum (k) f32; for fp16 the sum is still divided by G.
  void scatter_sum(std::size_t bucket, const Tensor& grads, Tensor& sum, std::int64_t k, const Group& g);
  // Zeroes the elements of this member's block (sum (k)) past the bucket's n elements.
  void zero_padding(Tensor& sum, std::int64_t n, std::int64_t k, const Group& g);
  DType wire_dtype() const;

  Backend& b_;
  GradCompression kind_;
  bool error_feedback_;
  // 1bit error feedback by bucket, allocated (zeroed) at first use.
  std::vector<Tensor> worker_error_;  // (G, k)
  std::vector<Tensor> server_error_;  // (1, k)
};

}  // namespace meshtrain
