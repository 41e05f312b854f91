// The forwarded ops whose costs need more than their operands (rope's share
// of the heads, an FP8 cast's copies) and the multi-tensor ops' groups.
#include "backends/backend_wrapper.h"

namespace meshtrain {

void BackendWrapper::rope(Tensor& x, int total, int rotate, float theta, bool inverse, std::int64_t first) {
  const Tensor* tensors[] = {&x};
  OpArgs args{tensors};
  args.share = total > 0 ? static_cast<double>(rotate) / total : 1.0;
  auto f = [&] { target().rope(x, total, rotate, theta, inverse, first); };
  on_op(op_info("rope"), args, Call(f));
}

void BackendWrapper::fp8_cast(const Tensor& x, const Fp8CastOp& op, Tensor& y, Tensor& amax) {
  const Tensor* tensors[] = {&x, &y, &amax};
  OpArgs args{tensors};
  args.fp8_cast = &op;
  auto f = [&] { target().fp8_cast(x, op, y, amax); };
  on_op(op_info("fp8_cast"), args, Call(f));
}

void BackendWrapper::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  std::vector<const Tensor*> tensors = {&out};
  for (const Tensor& x : xs) tensors.push_back(&x);
  auto f = [&] { target().foreach_sum_squares(xs, out); };
  on_op(op_info("foreach_sum_squares"), OpArgs{tensors}, Call(f));
}

void BackendWrapper::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef, const AdamWOp& op) {
  std::vector<const Tensor*> tensors = {&coef};
  for (const AdamWTensors& t : params) tensors.insert(tensors.end(), {&t.param, &t.grad, &t.m, &t.v});
  auto f = [&] { target().foreach_adamw(params, coef, op); };
  on_op(op_info("foreach_adamw"), OpArgs{tensors}, Call(f));
}

}  // namespace meshtrain
