// What every framework binding takes from the core besides the operations themselves (the
// Python torch module, the LibTorch API and the frontends to come): names for unnamed
// operations, argument checks, Horovod's reduction-op names with krug's values, and telling the
// job that a wait was interrupted. Written once here, so that no binding keeps a copy that
// could drift from the others.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "krug/krug.h"
#include "krug/types.h"

namespace krug {

// A bad argument found before anything was enqueued (bindings raise it as their language's
// argument error: ValueError in Python).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The name of an operation submitted without one: "<kind>.noname.<n>", where n counts this
// rank's unnamed `kind` operations on `process_set` since the last init() ("allreduce.noname.0"
// first). Ranks that make the same unnamed calls in the same order get the same names. The
// counters belong to the initialization: every init() starts them again at 0, so after an
// elastic reset the survivors and a newly added worker agree. Thread-safe; throws krug::Error
// when krug is not initialized.
std::string unnamed_op_name(std::string_view kind, ProcessSet process_set = kGlobalProcessSet);

// `name`, or unnamed_op_name(kind, process_set) when it is empty.
std::string name_or_unnamed(const std::string& name, std::string_view kind,
                            ProcessSet process_set = kGlobalProcessSet);

// Throws InvalidArgument unless `splits` (rows sent to each rank of `process_set`, in rank
// order) has one non-negative entry per rank and sums to `rows`, the tensor's first dimension.
// Empty splits mean an even split: accepted here, the engine checks that it divides. The
// negotiator applies the same rule to every rank's splits.
void check_alltoall_splits(std::span<const int64_t> splits, int64_t rows, ProcessSet process_set);

// Horovod's reduction-op names with krug's values, in Horovod's order: Average, Sum, Adasum, Min,
// Max, Product.
struct NamedReduceOp {
  std::string_view name;
  ReduceOp op;
};
std::span<const NamedReduceOp> reduce_ops();

// For a binding whose user interrupted a wait (Ctrl-C in Python): stops krug on this rank and
// tells every other rank, whose pending and later operations then fail with a message naming
// this rank, its host and `what` it was waiting in ("synchronize (KeyboardInterrupt in
// Python)"), instead of waiting for it until the timeout. shutdown() and init() may follow.
// Does nothing when krug is not initialized.
void report_interrupted(std::string_view what);

}  // namespace krug
