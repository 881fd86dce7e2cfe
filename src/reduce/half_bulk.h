// The implementations behind the public float16 bulk conversions. half.cc picks F16C at run time
// when the CPU has it; both are declared here so that tests can check each on any machine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace krug::reduce::detail {

void half_to_float_n_portable(const uint16_t* src, float* dst, size_t count);
void float_to_half_n_portable(const float* src, uint16_t* dst, size_t count);

// Whether the CPU and OS support F16C (and the AVX state it needs). The *_f16c functions must
// not be called when this is false.
bool has_f16c();
void half_to_float_n_f16c(const uint16_t* src, float* dst, size_t count);
void float_to_half_n_f16c(const float* src, uint16_t* dst, size_t count);

}  // namespace krug::reduce::detail
