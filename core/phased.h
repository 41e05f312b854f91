// Phased<T>: a C++20 coroutine that computes a T in phases, pausing between
// them (co_yield Pause{}) so that its caller can issue other work there.
//
// Why: Megatron-Core's EP all-to-all overlap (combined 1F1B) issues the
// forward of one micro-batch and the backward of another layer by layer,
// each layer cut at its all-to-alls, so that one pass's all-to-all runs
// while the other pass computes. A phase issues its all-to-all as it ends,
// before the other pass's next phase is issued. A pass written as one
// function (a chunk's forward, a layer's backward) becomes such a sequence
// of phases by pausing where it would hand over; run() ignores the pauses,
// so the same code serves the plain schedules.
//
// A coroutine that calls another passes its pauses on:
//   Phased<Tensor> inner = layer.forward_phased(...);
//   while (inner.resume()) co_yield Pause{};
//   Tensor out = inner.result();
//
// The coroutine starts suspended; resume() runs it to its next pause (true)
// or to its end (false). Parameters are kept by the coroutine frame: pass
// values, or references to what outlives the coroutine.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <utility>

namespace meshtrain {

struct Pause {};

template <class T>
class Phased {
 public:
  struct promise_type {
    std::optional<T> value;
    std::exception_ptr error;
    Phased get_return_object() { return Phased(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    std::suspend_always yield_value(Pause) noexcept { return {}; }
    void return_value(T v) { value = std::move(v); }
    void unhandled_exception() { error = std::current_exception(); }
  };

  Phased(Phased&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Phased& operator=(Phased&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Phased(const Phased&) = delete;
  Phased& operator=(const Phased&) = delete;
  ~Phased() {
    if (h_) h_.destroy();
  }

  bool done() const { return !h_ || h_.done(); }
  // Runs the next phase: true at a pause, false once the coroutine has returned.
  bool resume() {
    if (done()) return false;
    h_.resume();
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    return !h_.done();
  }
  // The value returned; only after resume() returned false.
  T result() { return std::move(*h_.promise().value); }
  // Every phase in a row, then the value.
  T run() {
    while (resume()) {
    }
    return result();
  }

 private:
  explicit Phased(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

// Runs two coroutines' phases by turns, `first`'s first phase first, until
// both have returned (the one left runs its remaining phases alone).
template <class A, class B>
void alternate(Phased<A>& first, Phased<B>& second) {
  bool a = true, b = true;
  while (a || b) {
    if (a) a = first.resume();
    if (b) b = second.resume();
  }
}

}  // namespace meshtrain
