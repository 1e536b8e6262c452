/// \file dispatch.cuh
/// \brief From run-time shape to compile-time kernel: one switch per template parameter,
/// the same macros in every stage.
///
/// A kernel is a template (element type, head_dim, group size, ...) so that loops unroll
/// and registers are sized at compile time; the shape arrives at run time. Each macro
/// turns one run-time value into a constant named by the caller and runs the body with
/// it; nested, they pick one instantiation:
///
///     FLASHSTEP_DISPATCH_DTYPE(shape.dtype, T, {
///       FLASHSTEP_DISPATCH_HEAD_DIM(shape.head_dim, HEAD_DIM, {
///         return make_entry<T, HEAD_DIM>();
///       });
///     });
///
/// The body is a statement block (it may `return` from the enclosing function); the
/// values listed in a macro are the instantiations every stage gets. A value outside
/// them throws DispatchError naming the parameter, so a stage's plan() that checked the
/// shape against its StageInfo never reaches that throw. The same vocabulary as
/// FlashInfer's DISPATCH_* macros (include/flashinfer/utils.cuh), written for this
/// project's types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace flashstep::kernels {

/// Thrown when a run-time value has no instantiation; what() names the parameter, the
/// value and the values that do.
class DispatchError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Throws DispatchError. \param name the parameter \param value its run-time value
/// \param supported the values the macro instantiates, as text
[[noreturn]] inline void dispatch_failed(const char* name, long long value, const char* supported) {
  throw DispatchError(std::string("no kernel for ") + name + " = " + std::to_string(value) +
                      " (instantiated: " + supported + ")");
}

/// The K/V element type of a kernel that may read an FP8 cache: calls `body` with a value
/// of type T when kv_dtype == dtype (K/V stored like q), of __nv_fp8_e4m3 or
/// __nv_fp8_e5m2 for an FP8 cache (instantiated for 16-bit T only: FP8 K/V is read with
/// fp16/bf16 queries), and returns what it returns. `Enum` is any enum with members e4m3
/// and e5m2 (stages' DType). The FP8 branches sit in an `if constexpr` of this template,
/// so no FP8 kernel is instantiated for an fp32 T.
template <typename T, typename Enum, typename Body>
auto dispatch_kv_dtype(Enum dtype, Enum kv_dtype, Body&& body) {
  if (kv_dtype == dtype) return body(T{});
  if constexpr (sizeof(T) == 2) {
    if (kv_dtype == Enum::e4m3) return body(__nv_fp8_e4m3{});
    if (kv_dtype == Enum::e5m2) return body(__nv_fp8_e5m2{});
  }
  dispatch_failed("kv_dtype", static_cast<long long>(kv_dtype), "q's dtype; e4m3 or e5m2 with f16/bf16 q");
}

}  // namespace flashstep::kernels

/// Element type: `dtype` is any enum with members f32, f16 and bf16 (stages' DType);
/// the body sees `using T = float | __half | __nv_bfloat16`.
#define FLASHSTEP_DISPATCH_DTYPE(dtype, T, ...)                                                               \
  switch (dtype) {                                                                                            \
    case std::decay_t<decltype(dtype)>::f32: {                                                                \
      using T = float;                                                                                        \
      __VA_ARGS__ break;                                                                                      \
    }                                                                                                         \
    case std::decay_t<decltype(dtype)>::f16: {                                                                \
      using T = __half;                                                                                       \
      __VA_ARGS__ break;                                                                                      \
    }                                                                                                         \
    case std::decay_t<decltype(dtype)>::bf16: {                                                               \
      using T = __nv_bfloat16;                                                                                \
      __VA_ARGS__ break;                                                                                      \
    }                                                                                                         \
    default: ::flashstep::kernels::dispatch_failed("dtype", static_cast<long long>(dtype), "f32, f16, bf16"); \
  }

/// K/V element type, inside FLASHSTEP_DISPATCH_DTYPE (which names T): the body sees
/// `using KV = T | __nv_fp8_e4m3 | __nv_fp8_e5m2` (kernels::dispatch_kv_dtype says which
/// are instantiated). Unlike the macros above, the body must return a value, and the
/// macro returns it from the enclosing function.
#define FLASHSTEP_DISPATCH_KV_DTYPE(dtype, kv_dtype, T, KV, ...)                             \
  return ::flashstep::kernels::dispatch_kv_dtype<T>((dtype), (kv_dtype), [&](auto kv_tag_) { \
    using KV = decltype(kv_tag_);                                                            \
    __VA_ARGS__                                                                              \
  });

/// head_dim 64, 128 or 256: the body sees `constexpr int HEAD_DIM`.
#define FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, ...)                                \
  switch (head_dim) {                                                                       \
    case 64: {                                                                              \
      constexpr int HEAD_DIM = 64;                                                          \
      __VA_ARGS__ break;                                                                    \
    }                                                                                       \
    case 128: {                                                                             \
      constexpr int HEAD_DIM = 128;                                                         \
      __VA_ARGS__ break;                                                                    \
    }                                                                                       \
    case 256: {                                                                             \
      constexpr int HEAD_DIM = 256;                                                         \
      __VA_ARGS__ break;                                                                    \
    }                                                                                       \
    default: ::flashstep::kernels::dispatch_failed("head_dim", (head_dim), "64, 128, 256"); \
  }

/// A yes/no choice made at compile time (causal or not, two halves or one): the body sees
/// `constexpr bool NAME`.
#define FLASHSTEP_DISPATCH_BOOL(condition, NAME, ...) \
  if (condition) {                                    \
    constexpr bool NAME = true;                       \
    __VA_ARGS__                                       \
  } else {                                            \
    constexpr bool NAME = false;                      \
    __VA_ARGS__                                       \
  }
