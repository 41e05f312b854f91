// Errors are values. The innermost layer says what is wrong and how to fix it;
// each caller on the way up may prepend where it happened (`context`). Only
// `main` turns an Error into a message and an exit code. Assertions guard
// invariants only, never user input.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace meshtrain {

class Error {
 public:
  explicit Error(std::string message) : message_(std::move(message)) {}
  const std::string& message() const { return message_; }
  // Prepends "where: " so the final message reads outermost first.
  Error& context(std::string_view where) {
    message_ = fmt::format("{}: {}", where, message_);
    return *this;
  }

 private:
  std::string message_;
};

template <class... Args>
Error make_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error(fmt::format(f, std::forward<Args>(args)...));
}

// Result<T>: a T or an Error. Result<void> (alias Status) carries only the Error.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }
  Result& context(std::string_view where) {
    if (!ok()) std::get<1>(v_).context(where);
    return *this;
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : e_(std::move(error)) {}
  bool ok() const { return !e_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const& { return *e_; }
  Error&& error() && { return std::move(*e_); }
  Result& context(std::string_view where) {
    if (e_) e_->context(where);
    return *this;
  }

 private:
  std::optional<Error> e_;
};

using Status = Result<void>;
inline Status ok_status() { return {}; }

}  // namespace meshtrain

#define MT_CONCAT_INNER(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_INNER(a, b)

// MT_TRY(expr): return the error of a failed Status/Result from the enclosing function.
#define MT_TRY(expr)                                        \
  do {                                                      \
    auto mt_try_result_ = (expr); /* by value: expr may return a reference into a temporary */ \
    if (!mt_try_result_.ok()) return std::move(mt_try_result_).error(); \
  } while (0)

// MT_ASSIGN(decl, expr): `decl = value` of a successful Result, else return its error.
#define MT_ASSIGN(decl, expr) MT_ASSIGN_IMPL(MT_CONCAT(mt_assign_, __LINE__), decl, expr)
#define MT_ASSIGN_IMPL(tmp, decl, expr)             \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).error();     \
  decl = std::move(tmp).value()
