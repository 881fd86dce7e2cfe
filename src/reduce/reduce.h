// Vectorized element-wise reduction kernels for every krug dtype.
//
// The engine and the collectives call these on raw buffers. Average is not a kernel: callers
// reduce with kSum and then scale(). Float16/bfloat16 are reduced in float32 and rounded back
// (round to nearest even), per element, so results do not depend on how a buffer is chunked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "krug/types.h"

namespace krug::reduce {

// dst[i] = op(dst[i], src[i]) for i in [0, count). kAverage is treated as kSum.
// For kBool: sum/max are logical OR, min/product are logical AND.
void reduce_into(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count);

// dst[i] = op(a[i], b[i]); dst may be a or b (the same pointer; partial overlap is not supported).
void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// data[i] *= factor, with Horovod's rounding per dtype: float64 in double; float32, float16 and
// bfloat16 in float32 with the factor rounded to float32 first; integers in double, converted
// toward zero and saturated to the type's range (NaN becomes 0); bool is unchanged.
// factor == 1.0 is a no-op.
void scale(DataType dtype, void* data, size_t count, double factor);

// IEEE binary16 and bfloat16 conversions (round to nearest even, NaN preserved).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

// Bulk conversions used by the kernels (vectorized where the CPU allows).
void half_to_float_n(const uint16_t* src, float* dst, size_t count);
void float_to_half_n(const float* src, uint16_t* dst, size_t count);
void bfloat16_to_float_n(const uint16_t* src, float* dst, size_t count);
void float_to_bfloat16_n(const float* src, uint16_t* dst, size_t count);

}  // namespace krug::reduce
