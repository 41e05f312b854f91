// make_cuda_backend: how code outside backends/cuda/ gets a cuda backend.
//
// This header names no CUDA type and includes no CUDA header, so its callers
// (the meshtrain CLI) compile in every build and need no #ifdef. The build
// picks the definition at link time: cuda_factory.cc (CudaBackend::create)
// where the cuda backend is built (MESHTRAIN_HAVE_CUDA), and
// cuda_factory_absent.cc, which says that the build has no CUDA, elsewhere.
// Both are the library meshtrain_cuda_factory.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain {

struct CudaBackendOptions {
  int device = -1;       // -1: chosen by the launcher's local rank (backends/cuda/device_select.h)
  bool use_mpi = false;  // rank and world from MPI_COMM_WORLD; MPI must be initialised already
  std::chrono::milliseconds comm_timeout{std::chrono::minutes(5)};  // NCCL watchdog
};

// Whether this build contains the cuda backend.
bool cuda_backend_built();

// The name of the CUDA device this process uses ("NVIDIA H200"), for
// records such as a calibration's device; "" without one.
std::string cuda_device_name();

// One rank's cuda backend. Errors: "this meshtrain was built without CUDA ..."
// in a build without it, "no CUDA device found ..." where none is visible,
// otherwise CudaBackend::create's (device selection, NCCL or MPI set-up).
// Under MPI every rank must call it: NCCL set-up is collective.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

// What calibrate times as an FP8 GEMM (engine/calibrate/measure.h): one
// cuBLASLt GEMM c (m, n) bf16 = a (m, k) · b (n, k)ᵀ of E4M3 operands, as
// Transformer Engine runs a linear's, with the fast accumulator (its forward)
// or the split one (`split_accumulator`: its dgrad and wgrad), on the stream
// current when it is made (CudaBackend::fp8_gemm_call; the call must not
// outlive `backend`). Errors: `backend` is not a cuda backend, its device has
// no FP8 tensor cores or cuBLASLt no FP8 kernel for the shape, or the build
// has no CUDA.
Result<std::function<void()>> cuda_fp8_gemm_call(Backend& backend, std::int64_t m, std::int64_t n, std::int64_t k,
                                                 bool split_accumulator);

}  // namespace meshtrain
