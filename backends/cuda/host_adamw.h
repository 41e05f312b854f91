// ZeRO-Offload's optimizer step on the host: AdamW over page-locked host
// buffers, run by the host's cores in the order of a CUDA stream (a host
// callback), with the cpu backend's kernel (backends/cpu/kernels/optimizer.h:
// vectorized, parallel over fixed chunks), so an offloaded update gives the
// cpu backend's bits. Host-only (g++) header.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/backend.h"

namespace meshtrain::cuda {

struct HostAdamW {
  struct Array {
    std::int64_t n = 0;  // elements
    float* param = nullptr;
    const float* grad = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    float weight_decay = 0.f;
  };
  std::vector<Array> arrays;  // pointers into page-locked host memory, alive until the update has run
  AdamWOp op;
  // The clip coefficient, copied into page-locked memory earlier on the same
  // stream and read when the update runs; null: no clipping.
  const float* coef = nullptr;
};

// Enqueues `update` on `stream` (a cudaStream_t): it runs on a CUDA host
// thread once the stream's earlier work is done, and later work on the
// stream waits for it. Returns the cudaError_t of the launch.
int enqueue_host_adamw(void* stream, HostAdamW update);

}  // namespace meshtrain::cuda
