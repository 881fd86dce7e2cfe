#include "krug/types.h"

#include <gtest/gtest.h>

namespace krug {
namespace {

TEST(TypesTest, SizesMatchTheWireFormat) {
  EXPECT_EQ(dtype_size(DataType::kUInt8), 1u);
  EXPECT_EQ(dtype_size(DataType::kBool), 1u);
  EXPECT_EQ(dtype_size(DataType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DataType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DataType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DataType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DataType::kUInt16), 2u);
  EXPECT_EQ(dtype_size(DataType::kUInt32), 4u);
  EXPECT_EQ(dtype_size(DataType::kUInt64), 8u);
  EXPECT_THROW(dtype_size(static_cast<DataType>(200)), Error);
}

TEST(TypesTest, NamesAreDistinct) {
  for (int i = 0; i < kNumDataTypes; ++i)
    for (int j = i + 1; j < kNumDataTypes; ++j)
      EXPECT_NE(dtype_name(DataType(i)), dtype_name(DataType(j)));
  EXPECT_EQ(reduce_op_name(ReduceOp::kAverage), "average");
}

}  // namespace
}  // namespace krug
