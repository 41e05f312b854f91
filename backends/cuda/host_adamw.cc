#include "backends/cuda/host_adamw.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "backends/cpu/kernels/optimizer.h"

namespace meshtrain::cuda {

namespace {

// A host callback may not call CUDA; it only reads and writes host memory.
void CUDART_CB run(void* data) {
  const std::unique_ptr<HostAdamW> u(static_cast<HostAdamW*>(data));
  const float coef = u->coef != nullptr ? *u->coef : 1.0f;
  std::vector<cpu::AdamWArrays<float>> arrays;
  arrays.reserve(u->arrays.size());
  for (const HostAdamW::Array& a : u->arrays) {
    const cpu::AdamWParams p{u->op.lr, u->op.beta1, u->op.beta2, u->op.eps, a.weight_decay, u->op.step,
                             u->op.variance_frozen_at};
    arrays.push_back({a.n, a.param, a.grad, a.m, a.v, cpu::AdamWStep<float>(p, coef)});
  }
  cpu::foreach_adamw(arrays);
}

}  // namespace

int enqueue_host_adamw(void* stream, HostAdamW update) {
  auto* u = new HostAdamW(std::move(update));
  const cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), run, u);
  if (e != cudaSuccess) delete u;
  return e;
}

}  // namespace meshtrain::cuda
